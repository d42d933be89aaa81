// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "testbed/agent_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <spdlog/spdlog.h>
#include <stdexcept>
#include <thread>

#include "agent/agent.h"
#include "cli/commands.h"

namespace mpsteer::cli {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string default_share() {
    std::error_code ec;
    auto self = fs::read_symlink("/proc/self/exe", ec);
    for (auto d = self.parent_path(); !ec && d.has_relative_path(); d = d.parent_path())
        if (fs::exists(d / "policies") && fs::exists(d / "lua")) return d.string();
    return "/usr/share/mpsteer";
}

std::string agent_binary() {
    return companion_binary("mpsteer");
}

std::string shipped_path(const std::string& share, const std::string& rel) {
    if (rel.rfind("lua", 0) == 0 && !fs::exists(share + "/lua")) return share + "/policies/" + rel;
    return share + "/" + rel;
}

const std::vector<ShippedElsewhere>& shipped_elsewhere() {
    static const std::vector<ShippedElsewhere> all = {
        {"multi-tenant.yaml", "a hypervisor with uplinks eth1, eth2"},
        {"ecf-scheduler.yaml", "a sender whose slow path is the cellular interface wwan0"},
        {"disjoint-subflows.yaml", "a client whose path manager opens a full mesh of subflows"},
        {"path-resilience.yaml", "a client with a subflow endpoint on each of its paths"}};
    return all;
}

ShippedAgent::ShippedAgent(const std::string& share, const std::string& netns,
                           const std::string& name, const std::vector<std::string>& leave_out)
    : state_("/run/mpsteer-" + name),
      pins_("/sys/fs/bpf/mpsteer-" + name),
      log_(state_ + "/agent.log") {
    agent::reset(pins_, state_);  // a leftover of a killed run with the same name
    fs::remove_all(state_);
    const std::string repo = state_ + "/repo";
    fs::create_directories(repo);
    fs::copy(share + "/policies", repo + "/policies", fs::copy_options::recursive);
    if (fs::exists(share + "/lua"))  // else the package's policies/lua came along
        fs::copy(share + "/lua", repo + "/lua", fs::copy_options::recursive);
    for (const auto& f : leave_out) fs::remove(repo + "/policies/" + f);
    args_ = {"run",  "--policies", repo,  "--netns",        netns, "--state-dir",
             state_, "--pin-root", pins_, "--metrics-port", "0"};
    if (agent_binary().empty())
        throw std::runtime_error(
            "the agent's binary (mpsteer) is not beside mpsteer-lab (nor in "
            "../../bin)");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
        int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        std::vector<char*> argv;
        std::string agent = agent_binary();
        argv.push_back(agent.data());
        for (auto& a : args_) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
}

ShippedAgent::~ShippedAgent() {
    stop();
    try {
        agent::reset(pins_, state_);
    } catch (const std::exception& e) {
        spdlog::warn("removing the agent's pins and state: {}", e.what());
    }
    std::error_code ec;
    fs::remove_all(state_, ec);
}

bool ShippedAgent::alive() {
    if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) != 0) pid_ = -1;  // exited (and reaped)
    return pid_ > 0;
}

void ShippedAgent::stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100 && alive(); ++i) std::this_thread::sleep_for(50ms);
    if (alive()) kill(pid_, SIGKILL);
    // alive() may have reaped it already: waitpid(-1) would wait for any other child.
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
}

nlohmann::json ShippedAgent::status() const {
    try {
        return agent::read_status(state_);
    } catch (const std::exception&) {
        return nlohmann::json::object();
    }
}

bool ShippedAgent::wait_status_update(std::chrono::seconds timeout) const {
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (status().value("updated_unix_ms", int64_t(0)) < now_ms) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(50ms);
    }
    return true;
}

nlohmann::json ShippedAgent::wait_ready(std::chrono::seconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const nlohmann::json st = status();
        if (st.value("ready", false)) return st;
        if (!alive() || !st.value("errors", nlohmann::json::array()).empty() ||
            std::chrono::steady_clock::now() > until) {
            std::system(("tail -n 20 " + log_ + " >&2").c_str());
            throw std::runtime_error("the agent did not become Ready (its log is above)");
        }
        std::this_thread::sleep_for(50ms);
    }
}

}  // namespace mpsteer::cli
