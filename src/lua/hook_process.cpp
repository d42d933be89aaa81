// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// HookProcess: the agent's side of the hook process (hook_process.h). Starts it, hands it
// requests, serves its scripts' Backend calls with the write budget, relays its log lines,
// and kills and restarts it when a call overruns or the process fails.
#include "lua/hook_process.h"

#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <new>

#include "lua/sandbox.h"
#include "net/text.h"

namespace mpsteer::lua {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// The user scripts run as: a dedicated one where the package made it, else nobody.
std::tuple<uint32_t, uint32_t, std::string> hook_user() {
    for (const char* name : {"mpsteer-hooks", "nobody"})
        if (const passwd* pw = getpwnam(name)) return {pw->pw_uid, pw->pw_gid, name};
    return {65534, 65534, "nobody"};
}

// The child's descriptors 3 and 4 are dup2'd from these: none of them may be 3 or 4 itself,
// or one dup2 would overwrite the source of the next.
net::Fd above_child_fds(net::Fd fd) {
    if (!fd || fd.get() > wire::kSlotFd) return fd;
    return net::Fd(fcntl(fd.get(), F_DUPFD_CLOEXEC, wire::kSlotFd + 1));
}

std::string describe_exit(int status) {
    if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
    if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
    return "ended";
}

// A policy name, checked against the scripts the agent configured.
template <typename T>
T in_range(const json& v, uint64_t hi, const char* what) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > hi)
        throw std::runtime_error(std::string(what) + " out of range");
    return static_cast<T>(v.get<uint64_t>());
}

}  // namespace

json HookProcessInfo::to_json() const {
    return {{"pid", pid},
            {"user", user},
            {"uid", uid},
            {"gid", gid},
            {"no_new_privs", no_new_privs},
            {"seccomp", seccomp},
            {"capabilities_dropped", capabilities_dropped},
            {"address_space_bytes", address_space},
            {"restarts", restarts},
            {"last_restart", last_restart},
            {"log_lines_dropped", log_lines_dropped},
            {"writes_refused", writes_refused},
            {"requests", requests}};
}

HookProcess::HookProcess(Backend& backend, HookProcessOptions opts)
    : backend_(backend), opts_(std::move(opts)) {
    try {
        slot_fd_ = above_child_fds(net::Fd(memfd_create("mpsteer-hook-slot", MFD_CLOEXEC)));
        if (!slot_fd_ || ftruncate(slot_fd_.get(), sizeof(wire::RunningSlot)) != 0)
            throw std::runtime_error(std::string("hook process: its slot: ") +
                                     std::strerror(errno));
        void* page = mmap(nullptr, sizeof(wire::RunningSlot), PROT_READ | PROT_WRITE, MAP_SHARED,
                          slot_fd_.get(), 0);
        if (page == MAP_FAILED)
            throw std::runtime_error(std::string("hook process: mapping its slot: ") +
                                     std::strerror(errno));
        slot_ = new (page) wire::RunningSlot;
        start();
    } catch (const std::exception& e) {
        // The agent runs on without hooks; configure() tries again.
        spdlog::error("{}", e.what());
        std::lock_guard lock(info_mu_);
        info_.last_restart = e.what();
    }
}

HookProcess::~HookProcess() {
    stop_process();
    if (slot_) munmap(slot_, sizeof(wire::RunningSlot));
}

void HookProcess::start() {
    if (!slot_) throw std::runtime_error("hook process: no slot");
    new (slot_) wire::RunningSlot;  // nothing of the last process's
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        throw std::runtime_error(std::string("hook process: socketpair: ") + std::strerror(errno));
    net::Fd ours(sv[0]), child = above_child_fds(net::Fd(sv[1]));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, child.get(), 3);  // dup2 clears FD_CLOEXEC
    posix_spawn_file_actions_adddup2(&fa, slot_fd_.get(), wire::kSlotFd);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // The agent blocks its signals for its signalfd: the child starts with none blocked.
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    char arg0[] = "mpsteer", arg1[] = "hook-host";
    char* argv[] = {arg0, arg1, nullptr};
    char* envp[] = {nullptr};
    pid_t pid = -1;
    int err = posix_spawn(&pid, opts_.executable.c_str(), &fa, &attr, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    child.reset();  // the child's copy only: EOF here when it dies
    if (err)
        throw std::runtime_error("hook process: starting " + opts_.executable + ": " +
                                 std::strerror(err));
    pid_ = pid;
    fd_ = std::move(ours);
    auto [uid, gid, user] = hook_user();
    try {
        if (opts_.rt_priority > 0) {
            sched_param sp{};
            sp.sched_priority = opts_.rt_priority;
            if (sched_setscheduler(pid_, SCHED_FIFO, &sp))
                spdlog::warn("hook process: SCHED_FIFO {}: {}", opts_.rt_priority,
                             std::strerror(errno));
        }
        wire::send(fd_.get(), {{"t", "setup"},
                               {"limits", opts_.limits},
                               {"uid", uid},
                               {"gid", gid},
                               {"address_space", opts_.address_space}});
        auto hello = wire::receive(fd_.get(), Clock::now() + std::chrono::seconds(10));
        if (!hello || hello->at("t") != "hello") throw wire::Error("no hello within 10 s");
        std::lock_guard lock(info_mu_);
        info_.pid = pid_;
        info_.user = hello->at("uid").get<uint32_t>() == uid ? user : "(unchanged)";
        info_.uid = hello->at("uid").get<uint32_t>();
        info_.gid = hello->at("gid").get<uint32_t>();
        info_.no_new_privs = hello->at("no_new_privs").get<bool>();
        info_.seccomp = hello->at("seccomp").get<bool>();
        info_.capabilities_dropped = hello->at("capabilities_dropped").get<bool>();
        info_.address_space = opts_.address_space;
        if (!info_.seccomp || info_.uid == 0)
            spdlog::warn(
                "hook process {}: {}{}", pid_,
                info_.uid == 0 ? "still runs as root (no CAP_SETUID), without capabilities" : "",
                info_.seccomp
                    ? ""
                    : "; no seccomp filter: " + hello->value("seccomp_error", std::string("?")));
    } catch (const std::exception& e) {
        stop_process();
        throw std::runtime_error(std::string("hook process: ") + e.what());
    }
    spdlog::info("hook process {} runs the scripts as {} (uid {})", pid_, info_.user, info_.uid);
}

void HookProcess::stop_process() {
    fd_.reset();
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        int st;
        while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
    }
    pid_ = -1;
}

std::vector<ScriptSpec> HookProcess::runnable() {
    std::vector<ScriptSpec> out;
    for (const auto& s : specs_) {
        auto it = disabled_.find(s.policy);
        if (it == disabled_.end() || it->second.source != s.source) out.push_back(s);
    }
    runnable_ = out.size();
    idle_ticks_ = std::any_of(out.begin(), out.end(), [](auto& s) { return s.idle_every_ms; });
    std::lock_guard lock(info_mu_);
    slot_names_.clear();
    for (const auto& s : out) slot_names_.emplace_back(s.policy, s.name);
    return out;
}

std::optional<RunningCall> HookProcess::running() const {
    auto c = slot_ ? wire::read(*slot_) : std::nullopt;
    if (!c) return std::nullopt;
    std::lock_guard lock(info_mu_);
    if (c->spec >= slot_names_.size()) return std::nullopt;
    const auto& [policy, script] = slot_names_[c->spec];
    return RunningCall{policy, script, wire::call_name(c->what), c->since};
}

void HookProcess::restart(const std::string& what) {
    const auto running = this->running();
    int status = 0;
    std::string how = what;
    if (pid_ > 0) {
        // Dead already, or killed now: either way its exit says which.
        kill(pid_, SIGKILL);
        while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
        if (what.empty()) how = "the hook process " + describe_exit(status);
        pid_ = -1;
    }
    fd_.reset();
    std::string culprit;
    if (running) {
        for (const auto& s : specs_)
            if (s.policy == running->policy)
                disabled_[s.policy] = {s.source, how + " in " + running->hook};
        culprit =
            " while lua " + running->policy + " (" + running->script + ") ran " + running->hook;
    }
    spdlog::error("hook process: {}{}; restarting it{}", net::escape_control(how),
                  net::escape_control(culprit), running ? " without that script" : "");
    {
        std::lock_guard lock(info_mu_);
        ++info_.restarts;
        info_.last_restart = how + culprit;
        info_.pid = 0;
    }
    if (restarting_) return;  // a failure while configuring the new process: the loop below
    restarting_ = true;
    for (size_t attempt = 0; attempt < specs_.size() + 2; ++attempt) {
        try {
            start();
        } catch (const std::exception& e) {
            spdlog::error("{}; the hooks are off", e.what());
            break;
        }
        if (exchange({{"t", "configure"},
                      {"specs", runnable()},
                      {"revision", revision_},
                      {"generation", generation_}}))
            break;
    }
    restarting_ = false;
}

void HookProcess::finish_writes_second() {
    for (const auto& [policy, over] : throttled_)
        if (over && throttled_before_[policy]) to_disable_.push_back(policy);
    throttled_before_ = std::exchange(throttled_, {});
    writes_.clear();
    writes_second_ = Clock::now();
}

const std::string& HookProcess::policy_of(const json& call) const {
    const auto& p = call.at("policy").get_ref<const std::string&>();
    for (const auto& s : specs_) {
        if (s.policy != p) continue;
        auto off = disabled_.find(p);
        if (off == disabled_.end() || off->second.source != s.source) return p;
    }
    throw std::runtime_error("no script of policy '" + p + "' runs");
}

json HookProcess::serve_call(const json& call) {
    const auto& fn = call.at("fn").get_ref<const std::string&>();
    auto charge_write = [&](const std::string& policy) {
        if (Clock::now() - writes_second_ >= std::chrono::seconds(1)) finish_writes_second();
        if (++writes_[policy] > opts_.writes_per_second) {
            throttled_[policy] = true;
            std::lock_guard lock(info_mu_);
            ++info_.writes_refused;
            throw std::runtime_error("more than " + std::to_string(opts_.writes_per_second) +
                                     " writes in a second: refused (the script is disabled if "
                                     "it goes on)");
        }
    };
    try {
        json value;
        if (fn == "connections") {
            value = backend_.connections();
        } else if (fn == "connection") {
            auto c = backend_.connection(in_range<uint32_t>(call.at("token"), UINT32_MAX, "token"));
            value = c ? json(*c) : json(nullptr);
        } else if (fn == "subflow") {
            auto s = backend_.subflow(in_range<uint64_t>(call.at("id"), UINT64_MAX, "id"));
            value = s ? json(*s) : json(nullptr);
        } else if (fn == "no_connections") {
            value = backend_.no_connections();
        } else if (fn == "set_subflow") {
            const auto& policy = policy_of(call);
            SubflowSettings st;
            // bytes/s; the backend clamps it to what rate_limit takes
            if (call.contains("rate"))
                st.rate = in_range<uint64_t>(call.at("rate"), UINT64_MAX, "rate");
            if (call.contains("backup")) st.backup = call.at("backup").get<bool>();
            charge_write(policy);
            value = backend_.set_subflow(policy,
                                         in_range<uint64_t>(call.at("id"), UINT64_MAX, "id"), st);
        } else if (fn == "add_subflow" || fn == "block_address") {
            const auto& policy = policy_of(call);
            auto token = in_range<uint32_t>(call.at("token"), UINT32_MAX, "token");
            auto id = in_range<uint8_t>(call.at("addr_id"), 255, "addr_id");
            charge_write(policy);
            value = fn == "add_subflow" ? backend_.add_subflow(policy, token, id)
                                        : backend_.block_address(policy, token, id);
        } else if (fn == "endpoints") {
            value = backend_.endpoints();
        } else if (fn == "renew_endpoint") {
            const auto& policy = policy_of(call);
            const auto& address = call.at("address").get_ref<const std::string&>();
            charge_write(policy);
            value = backend_.renew_endpoint(policy, address);
        } else if (fn == "set_policy_backup") {
            const auto& policy = policy_of(call);
            bool backup = call.at("backup").get<bool>();
            charge_write(policy);
            value = backend_.set_policy_backup(policy, backup);
        } else {
            throw std::runtime_error("no such call: " + fn);
        }
        return {{"t", "ret"}, {"value", value}};
    } catch (const json::exception& e) {
        return {{"t", "ret"}, {"error", std::string("malformed request: ") + e.what()}};
    } catch (const std::exception& e) {
        return {{"t", "ret"}, {"error", e.what()}};
    }
}

void HookProcess::log_line(const json& m) {
    const auto now = Clock::now();
    if (now - log_second_ >= std::chrono::seconds(1)) {
        std::lock_guard lock(info_mu_);
        if (log_lines_ > opts_.log_lines_per_second)
            spdlog::warn("hook process: {} log lines dropped (more than {} a second)",
                         log_lines_ - opts_.log_lines_per_second, opts_.log_lines_per_second);
        log_second_ = now;
        log_lines_ = 0;
    }
    if (++log_lines_ > opts_.log_lines_per_second) {
        std::lock_guard lock(info_mu_);
        ++info_.log_lines_dropped;
        return;
    }
    auto level = spdlog::level::from_str(m.at("level").get<std::string>());
    if (level == spdlog::level::off) level = spdlog::level::info;
    spdlog::log(level, "{}", net::escape_control(m.at("text").get<std::string>()));
}

std::optional<json> HookProcess::exchange(const json& request) {
    if (pid_ < 0) return std::nullopt;  // the hooks are off (the process could not start)
    // Each script call has its budget from when it began (the slot says); the request as a
    // whole at most as many budgets as it can make calls (setup, chunk and a hook per script,
    // or an event's hook and the idle tick after it), whatever the process writes there.
    const auto budget = opts_.limits.call_time + opts_.grace;
    const auto sent = Clock::now();
    const Clock::time_point cap = sent + budget * int64_t(3 * runnable_ + 1);
    Clock::time_point began = sent;  // the latest call the slot showed, else the request
    Clock::duration served{0};       // the agent's time serving calls is not the scripts'
    auto deadline = [&] { return std::min(cap, began + budget + served); };
    std::string failure;
    {
        std::lock_guard lock(info_mu_);
        ++info_.requests;
    }
    try {
        wire::send(fd_.get(), request);
        for (;;) {
            auto m = wire::receive(fd_.get(), deadline());
            if (!m) {
                auto call = wire::read(*slot_);
                if (call && call->since > began) {
                    began = call->since;
                    if (deadline() > Clock::now()) continue;
                }
                auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(budget).count();
                failure = "a call ran past its " + std::to_string(ms) + " ms";
                break;
            }
            const auto& t = m->at("t").get_ref<const std::string&>();
            if (t == "call") {
                const auto t0 = Clock::now();
                wire::send(fd_.get(), serve_call(*m));
                served += Clock::now() - t0;
            } else if (t == "log") {
                log_line(*m);
            } else if (t == "done") {
                if (!m->at("calls").is_number_unsigned()) {
                    failure = "the hook process broke the protocol: `calls` is not a count";
                    break;
                }
                // Settings the hooks returned: carried out now, within the write budget.
                if (m->contains("writes"))
                    for (const auto& w : m->at("writes")) {
                        auto r = serve_call(w);
                        if (r.contains("error"))
                            spdlog::debug("hook process: a returned setting: {}",
                                          r["error"].get<std::string>());
                    }
                calls_ = m->at("calls").get<uint64_t>();
                if (m->contains("hooks")) {
                    defined_hooks_ = 0;
                    for (const auto& h : m->at("hooks"))
                        if (int i = hook_index(h.get_ref<const std::string&>().c_str()); i >= 0)
                            defined_hooks_ |= 1u << i;
                }
                if (m->contains("next")) next_tick_ = wire::from_ns(m->at("next").get<int64_t>());
                // Scripts that went on writing past their budget for a second second.
                for (const auto& policy : std::exchange(to_disable_, {})) {
                    for (const auto& s : specs_)
                        if (s.policy == policy)
                            disabled_[policy] = {s.source,
                                                 "went on writing past " +
                                                     std::to_string(opts_.writes_per_second) +
                                                     " writes a second"};
                    exchange(
                        {{"t", "disable"}, {"policy", policy}, {"why", disabled_[policy].why}});
                }
                return m;
            } else {
                failure = "the hook process sent an unknown message";
                break;
            }
        }
    } catch (const wire::Error& e) {
        failure = "";  // the exit status says what happened
        if (pid_ > 0) {
            // A process that closed its socket is exiting: a moment to see it end (left for
            // restart() to reap, with its status); one still alive broke the protocol.
            siginfo_t si{};
            for (int i = 0; i < 50; ++i) {
                si.si_pid = 0;
                if (waitid(P_PID, id_t(pid_), &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid)
                    break;
                usleep(2000);
            }
            if (!si.si_pid) failure = std::string("hook process: ") + e.what();
        }
    } catch (const json::exception& e) {
        failure = std::string("the hook process broke the protocol: ") + e.what();
    }
    restart(failure);
    return std::nullopt;
}

std::vector<std::string> HookProcess::configure(const std::vector<ScriptSpec>& specs,
                                                const std::string& revision, uint32_t generation) {
    specs_ = specs;
    revision_ = revision;
    generation_ = generation;
    // A changed script is given another chance; a removed one is forgotten.
    for (auto it = disabled_.begin(); it != disabled_.end();) {
        bool keep = false;
        for (const auto& s : specs_) keep |= s.policy == it->first && s.source == it->second.source;
        it = keep ? std::next(it) : disabled_.erase(it);
    }
    if (pid_ < 0 && !restarting_) {
        try {
            start();
        } catch (const std::exception& e) {
            spdlog::error("{}; the hooks are off", e.what());
            return {};
        }
    }
    auto r = exchange({{"t", "configure"},
                       {"specs", runnable()},
                       {"revision", revision},
                       {"generation", generation}});
    if (!r) return {};
    try {
        return r->value("loaded", std::vector<std::string>{});
    } catch (const json::exception& e) {
        restart(std::string("the hook process broke the protocol: ") + e.what());
        return {};
    }
}

bool HookProcess::wanted(const char* hook) const {
    return idle_ticks_ || (defined_hooks_ >> hook_index(hook) & 1);
}

void HookProcess::on_connection(const Connection& c) {
    if (wanted("on_connection")) exchange({{"t", "connection"}, {"v", c}});
}
void HookProcess::on_subflow(const Subflow& s) {
    if (wanted("on_subflow")) exchange({{"t", "subflow"}, {"v", s}});
}
void HookProcess::on_subflow_closed(const Subflow& s) {
    if (wanted("on_subflow_closed")) exchange({{"t", "subflow_closed"}, {"v", s}});
}
void HookProcess::on_add_addr_blocked(const AddAddr& a) {
    if (wanted("on_add_addr_blocked")) exchange({{"t", "add_addr_blocked"}, {"v", a}});
}
void HookProcess::on_link(const Link& l) {
    if (wanted("on_link")) exchange({{"t", "link"}, {"v", l}});
}

Clock::time_point HookProcess::tick(Clock::time_point now) {
    if (!exchange({{"t", "tick"}, {"now", wire::to_ns(now)}}))
        return Clock::now() + std::chrono::seconds(1);
    return next_tick_;
}

Clock::time_point HookProcess::wake(Clock::time_point) {
    return next_tick_;  // the process woke its idle scripts after the events themselves
}

std::vector<ScriptStatus> HookProcess::status() {
    std::vector<ScriptStatus> out;
    if (auto r = exchange({{"t", "status"}})) {
        try {
            out = r->at("status").get<std::vector<ScriptStatus>>();
        } catch (const json::exception& e) {
            restart(std::string("the hook process broke the protocol: ") + e.what());
        }
    }
    for (const auto& s : specs_) {
        auto it = disabled_.find(s.policy);
        if (it == disabled_.end() || it->second.source != s.source) continue;
        bool listed = false;
        for (const auto& o : out) listed |= o.policy == s.policy;
        if (listed) continue;
        ScriptStatus st;
        st.policy = s.policy;
        st.script = s.name;
        st.disabled = true;
        st.last_error = it->second.why;
        out.push_back(st);
    }
    return out;
}

HookProcessInfo HookProcess::info() const {
    std::lock_guard lock(info_mu_);
    return info_;
}

}  // namespace mpsteer::lua
