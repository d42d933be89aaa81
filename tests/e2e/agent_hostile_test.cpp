// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent against what a policy committer or a local user can throw at it: signals and a log
// pipe whose reader went away, a stream of changes right after an apply (the loop must sleep),
// a revision directory that vanishes and comes back, a state directory it cannot write, links
// planted at its state files, and text from the repository that tries to forge log lines.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/fs.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent_harness.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

bool ready(const json& s) {
    return s.value("ready", false);
}

const json* condition(const json& s, const std::string& type) {
    if (!s.contains("conditions")) return nullptr;
    for (const auto& c : s["conditions"])
        if (c.value("type", "") == type) return &c;
    return nullptr;
}

// CPU time (user + system, every thread) the process has used.
double cpu_seconds(pid_t pid) {
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string f;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {
        if (i == 14) utime = std::stoull(f);
        if (i == 15) stime = std::stoull(f);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Reads `fd` until the text read holds `needle`; false on timeout.
bool read_until(int fd, const std::string& needle, std::chrono::milliseconds timeout,
                std::string& text) {
    const auto until = Clock::now() + timeout;
    while (text.find(needle) == std::string::npos) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
        if (left <= 0ms) return false;
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
        char buf[4096];
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) return false;
        text.append(buf, static_cast<size_t>(n));
    }
    return true;
}

// chattr +i on a directory (nothing can be created or renamed in it), undone when it goes.
class Immutable {
public:
    explicit Immutable(std::string dir) : dir_(std::move(dir)) { ok_ = set(true); }
    ~Immutable() { set(false); }
    bool ok() const { return ok_; }

private:
    bool set(bool on) {
        int fd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return false;
        int flags = 0;
        bool ok = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
        flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
        ok = ok && ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
        close(fd);
        return ok;
    }
    std::string dir_;
    bool ok_ = false;
};

// Bytes no log line may carry: C0 controls but the line end, DEL, C1 controls as UTF-8.
std::string control_bytes_in(const std::string& text) {
    std::string found;
    for (size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        const bool c1 = c == 0xC2 && i + 1 < text.size() &&
                        static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                        static_cast<unsigned char>(text[i + 1]) < 0xA0;
        if ((c < 0x20 && c != '\n') || c == 0x7F || c1)
            found += "byte " + std::to_string(c) + " at " + std::to_string(i) + "; ";
    }
    return found;
}

}  // namespace

TEST_CASE("agent hostile: SIGPIPE, SIGUSR1 and a closed log pipe leave the agent running",
          "[agent][signals]") {
    Lab lab(lab_config("hpip"));
    AgentHarness h(lab, "hpipe");
    PolicyGen gen(lab, 11);
    h.publish(gen.valid(1).files);
    int out[2];
    REQUIRE(pipe2(out, O_CLOEXEC) == 0);
    h.output_fd = out[1];
    h.start();
    close(out[1]);
    std::string text;
    REQUIRE(h.wait_status(ready, 120s));
    // SIGUSR1 logs a summary.
    ::kill(h.pid(), SIGUSR1);
    CHECK(read_until(out[0], "SIGUSR1: applied", 10s, text));
    INFO("agent output:\n" << text);
    ::kill(h.pid(), SIGPIPE);
    std::this_thread::sleep_for(500ms);
    REQUIRE(h.alive());
    // The reader goes away: every log line from now on meets EPIPE.
    close(out[0]);
    ::kill(h.pid(), SIGHUP);
    ::kill(h.pid(), SIGUSR1);
    std::this_thread::sleep_for(1s);
    REQUIRE(h.alive());
    const int64_t after = unix_ms_now();
    CHECK(h.wait_status(
        [&](const json& s) { return ready(s) && s.value("updated_unix_ms", int64_t(0)) > after; },
        10s));
    const int st = h.stop();
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("agent hostile: changes that keep arriving after an apply do not spin the loop",
          "[agent]") {
    Lab lab(lab_config("hspn"));
    AgentHarness h(lab, "hspin", 300);  // debounce 300 ms: the changes below keep it pending
    PolicyGen gen(lab, 12);
    h.publish(gen.valid(1).files);
    h.start();
    REQUIRE(h.wait_status(ready, 120s));
    std::this_thread::sleep_for(1s);  // the start-up apply's quiet period is over
    const std::string id = h.publish(gen.valid(2).files);
    REQUIRE(h.wait_status(
        [&](const json& s) { return ready(s) && s.value("applied_revision", "") == id; }, 30s,
        1ms));
    // Right after the apply, inside its quiet period: a hidden file of the revision (watched,
    // not content) changes every 20 ms for 3 s.
    const std::string touched = h.dir() + "/revs/" + id + "/.touched";
    const double cpu_before = cpu_seconds(h.pid());
    const auto t0 = Clock::now();
    for (int i = 0; Clock::now() - t0 < 3s; ++i) {
        std::ofstream(touched) << i;
        std::this_thread::sleep_for(20ms);
    }
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double share = (cpu_seconds(h.pid()) - cpu_before) / wall;
    INFO("agent CPU while changes arrive: " << share * 100 << " % of a core\n" << h.log_tail());
    CHECK(share < 0.3);
    CHECK(h.alive());
}

TEST_CASE(
    "agent hostile: a revision directory that vanishes and comes back unchanged is ready "
    "again",
    "[agent]") {
    Lab lab(lab_config("hvan"));
    AgentHarness h(lab, "hvanish");
    h.extra_args = {"--resync-s", "1"};
    PolicyGen gen(lab, 13);
    const std::string id = h.publish(gen.valid(1).files);
    h.start();
    REQUIRE(h.wait_status(ready, 120s));
    const std::string rev = h.dir() + "/revs/" + id;
    fs::rename(rev, rev + ".away");
    INFO("agent log:\n" << h.log_tail());
    REQUIRE(h.wait_status(
        [](const json& s) {
            const json* c = condition(s, "Stalled");
            return c && c->value("status", false) && c->value("reason", "") == "SourceUnavailable";
        },
        10s));
    fs::rename(rev + ".away", rev);
    CHECK(h.wait_status(
        [&](const json& s) { return ready(s) && s.value("applied_revision", "") == id; }, 10s));
}

TEST_CASE("agent hostile: a revision with more directories than the agent watches is refused",
          "[agent]") {
    Lab lab(lab_config("hdir"));
    AgentHarness h(lab, "hdirs");
    PolicyGen gen(lab, 16);
    const std::string first = h.publish(gen.valid(1).files);
    h.start();
    REQUIRE(h.wait_status(ready, 120s));
    Files many = gen.valid(2).files;
    for (int i = 0; i < 1100; ++i) many["d/" + std::to_string(i) + "/x.txt"] = "x\n";
    const std::string big = h.publish(many);
    INFO("agent log:\n" << h.log_tail());
    CHECK(h.wait_status(
        [&](const json& s) {
            const json* c = condition(s, "Stalled");
            return s.value("attempted_revision", "") == big && c &&
                   c->value("reason", "") == "ValidationFailed" &&
                   c->value("message", "").find("more than 1024 directories") !=
                       std::string::npos &&
                   s.value("applied_revision", "") == first;
        },
        30s));
    const std::string fixed = h.publish(gen.valid(3).files);
    CHECK(h.wait_status(
        [&](const json& s) { return ready(s) && s.value("applied_revision", "") == fixed; }, 30s));
}

TEST_CASE("agent hostile: a state directory it cannot write is reported and retried, never fatal",
          "[agent]") {
    Lab lab(lab_config("hro"));
    AgentHarness h(lab, "hreadonly");
    h.metrics_port = 19478;
    PolicyGen gen(lab, 14);
    h.publish(gen.valid(1).files);
    h.start();
    REQUIRE(h.wait_status(ready, 120s));
    {
        Immutable frozen(h.state_dir());
        REQUIRE(frozen.ok());
        std::this_thread::sleep_for(3s);
        INFO("agent log:\n" << h.log_tail());
        REQUIRE(h.alive());
        // Said once, not every second.
        const std::string log = h.log_tail(100000);
        const std::string said = "status.json: Operation not permitted (retried every second)";
        CHECK(log.find(said) != std::string::npos);
        CHECK(log.find(said) == log.rfind(said));
        auto m = run_in(lab.server_ns(), {"curl", "-sf", "http://127.0.0.1:19478/metrics"});
        INFO(m.out);
        CHECK(m.out.find("mpsteer_status_write_failures_total 0\n") == std::string::npos);
        CHECK(m.out.find("mpsteer_status_write_failures_total ") != std::string::npos);
    }
    // Writable again: written, and the status says what happened meanwhile.
    const int64_t after = unix_ms_now();
    INFO("agent log:\n" << h.log_tail());
    CHECK(h.wait_status(
        [&](const json& s) {
            const json* c = condition(s, "StateWritable");
            return s.value("updated_unix_ms", int64_t(0)) > after && c &&
                   c->value("message", "").find("could not be written") != std::string::npos;
        },
        10s));
    CHECK(h.alive());
}

TEST_CASE("agent hostile: links planted at its state files are never written through", "[agent]") {
    Lab lab(lab_config("hlnk"));
    AgentHarness h(lab, "hlinks");
    PolicyGen gen(lab, 15);
    h.publish(gen.valid(1).files);
    const std::string outside = h.dir() + "/outside", victim = outside + "/victim";
    fs::create_directories(outside);
    std::ofstream(victim) << "keep\n";
    fs::create_symlink(outside + "/created-by-agent", h.state_dir() + "/events.jsonl");
    fs::create_symlink(victim, h.state_dir() + "/status.json");
    fs::create_symlink(outside, h.state_dir() + "/state");
    h.start();
    INFO("agent log:\n" << h.log_tail());
    REQUIRE(h.wait_status(ready, 120s));
    std::this_thread::sleep_for(1500ms);  // an event log retry, generation and applied files
    CHECK_FALSE(fs::exists(outside + "/created-by-agent"));
    CHECK(slurp(victim) == "keep\n");
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(outside)) left.push_back(e.path().filename());
    CHECK(left == std::vector<std::string>{"victim"});
    // Said, not silently skipped.
    const json s = h.status();
    CHECK(s["state_files"].value("event_log_error", "").find("symbolic link") != std::string::npos);
    const json* c = condition(s, "StateWritable");
    REQUIRE(c);
    CHECK_FALSE(c->value("status", true));
    CHECK(h.log_tail().find("events.jsonl: is a symbolic link, not followed") != std::string::npos);
    CHECK(h.alive());
}

TEST_CASE("agent hostile: text from the repository cannot forge log lines or status lines",
          "[agent]") {
    Lab lab(lab_config("hlog"));
    AgentHarness h(lab, "hforge");
    const std::string policy =
        "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: forger}\nspec:\n"
        "  attach: {hooks: [tc_ingress]}\n  priority: 100\n  select:\n"
        "    - port: {either: 5201}\n  actions:\n    - record: {}\n"
        "  hooks:\n    script: lua/forge.lua\n";
    // Lua escapes: a newline, a forged log prefix, CR, ESC sequences, BEL, DEL and C1 CSI.
    const std::string script = R"(
function on_apply(i)
  mpsteer.log('info', 'one\n[2030-01-01 00:00:00.000] [error] forged line\r\27[2J\27]0;title\7\127\194\155x')
  print('printed\nforged print')
  error('bad\nforged error\27[31m')
end
)";
    h.publish({{"policies/p.yaml", policy}, {"lua/forge.lua", script}});
    h.start();
    REQUIRE(h.wait_status(ready, 120s));
    REQUIRE(h.wait_log("forged error", 10s));
    // A broken revision whose diagnostics quote a key full of control characters.
    h.publish({{"policies/p.yaml",
                "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: forger}\nspec:\n"
                "  \"evil\\n[2030-01-01 00:00:00.000] [info] forged key\\e[2J\": 1\n"}});
    REQUIRE(h.wait_status([](const json& s) { return s["applies"].value("failed", 0) >= 1; }, 30s));
    std::this_thread::sleep_for(500ms);
    const std::string log = h.log(1);
    INFO("agent log:\n" << log);
    CHECK(control_bytes_in(log) == "");
    std::istringstream lines(log);
    int forged = 0;
    for (std::string line; std::getline(lines, line);) {
        if (line.find("forged") == std::string::npos) continue;
        ++forged;
        CHECK(line.rfind("[2030", 0) == std::string::npos);  // no line starts with the forgery
        CHECK(line.rfind("[20", 0) == 0);                    // each is the agent's own line
    }
    CHECK(forged >= 3);
    // The status: every string one line, no control character (after JSON decoding).
    const std::string status_text = json(h.status()).dump(-1, ' ', false);
    CHECK(control_bytes_in(h.status()["lua_hooks"].dump()) == "");
    std::function<void(const json&)> no_controls = [&](const json& j) {
        if (j.is_string()) {
            INFO(j.get<std::string>());
            CHECK(control_bytes_in(j.get<std::string>()) == "");
            CHECK(j.get<std::string>().find('\n') == std::string::npos);
        } else if (j.is_structured()) {
            for (const auto& v : j) no_controls(v);
        }
    };
    no_controls(h.status());
    CHECK(status_text.find("forged error") != std::string::npos);
}
