// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// `mpsteer hook-host`: the hook process (hook_process.h). Confines itself before the first
// script arrives, then runs the scripts (a HookSet) on the agent's requests, its Backend being
// requests back to the agent.
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <seccomp.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "lua/hook_process.h"
#include "lua/hook_wire.h"

namespace mpsteer::lua {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// The scripts' Backend: each call a request the agent answers (and may refuse: the script
// gets the refusal as a Lua error).
class AgentBackend : public Backend {
public:
    explicit AgentBackend(int fd) : fd_(fd) {}
    std::vector<Connection> connections() override {
        return ask({{"fn", "connections"}}).get<std::vector<Connection>>();
    }
    std::optional<Connection> connection(uint32_t token) override {
        auto v = ask({{"fn", "connection"}, {"token", token}});
        if (v.is_null()) return std::nullopt;
        return v.get<Connection>();
    }
    std::optional<Subflow> subflow(uint64_t id) override {
        auto v = ask({{"fn", "subflow"}, {"id", id}});
        if (v.is_null()) return std::nullopt;
        return v.get<Subflow>();
    }
    bool set_subflow(const std::string& policy, uint64_t id, const SubflowSettings& s) override {
        json q = {{"fn", "set_subflow"}, {"policy", policy}, {"id", id}};
        if (s.rate) q["rate"] = *s.rate;
        if (s.backup) q["backup"] = *s.backup;
        return ask(q).get<bool>();
    }
    bool add_subflow(const std::string& policy, uint32_t token, uint8_t addr_id) override {
        return ask({{"fn", "add_subflow"},
                    {"policy", policy},
                    {"token", token},
                    {"addr_id", addr_id}})
            .get<bool>();
    }
    bool block_address(const std::string& policy, uint32_t token, uint8_t addr_id) override {
        return ask({{"fn", "block_address"},
                    {"policy", policy},
                    {"token", token},
                    {"addr_id", addr_id}})
            .get<bool>();
    }
    int set_policy_backup(const std::string& policy, bool backup) override {
        return ask({{"fn", "set_policy_backup"}, {"policy", policy}, {"backup", backup}})
            .get<int>();
    }
    bool no_connections() override { return ask({{"fn", "no_connections"}}).get<bool>(); }
    std::vector<Endpoint> endpoints() override {
        return ask({{"fn", "endpoints"}}).get<std::vector<Endpoint>>();
    }
    bool renew_endpoint(const std::string& policy, const std::string& address) override {
        return ask({{"fn", "renew_endpoint"}, {"policy", policy}, {"address", address}})
            .get<bool>();
    }
    void set_subflow_returned(const std::string& policy, uint64_t id,
                              const SubflowSettings& s) override {
        json q = {{"fn", "set_subflow"}, {"policy", policy}, {"id", id}};
        if (s.rate) q["rate"] = *s.rate;
        if (s.backup) q["backup"] = *s.backup;
        returned_.push_back(std::move(q));
    }
    // The returned settings since the last call, for the request's answer.
    json take_returned() { return std::exchange(returned_, json::array()); }

private:
    json ask(json q) {
        q["t"] = "call";
        wire::send(fd_, q);
        auto r = wire::receive(fd_);
        if (!r || r->at("t") != "ret") throw wire::Error("the agent did not answer a call");
        if (r->contains("error")) throw std::runtime_error(r->at("error").get<std::string>());
        return r->at("value");
    }
    int fd_;
    json returned_ = json::array();
};

// Log lines go to the agent, which escapes them, caps them and writes them to its log.
class AgentSink : public spdlog::sinks::base_sink<std::mutex> {
public:
    explicit AgentSink(int fd) : fd_(fd) {}

protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
        try {
            wire::send(fd_, {{"t", "log"},
                             {"level", spdlog::level::to_string_view(msg.level).data()},
                             {"text", std::string(msg.payload.data(), msg.payload.size())}});
        } catch (const std::exception&) {
            // The agent is gone: the next receive ends the process.
        }
    }
    void flush_() override {}

private:
    int fd_;
};

struct Confinement {
    bool no_new_privs = false, seccomp = false, capabilities_dropped = false;
    std::string seccomp_error;
};

// What the scripts' process may ask of the kernel: its socket, memory, the clock, its own end.
// Everything else (open, socket, clone, execve, kill, ptrace, bpf, ...) fails with EPERM.
constexpr const char* kAllowedSyscalls[] = {
    "read",
    "write",
    "recvfrom",
    "sendto",
    "recvmsg",
    "sendmsg",
    "poll",
    "ppoll",
    "close",
    "brk",
    "mmap",
    "mmap2",
    "munmap",
    "mremap",
    "madvise",
    "mprotect",
    "futex",
    "futex_time64",
    "clock_gettime",
    "clock_gettime64",
    "gettimeofday",
    "nanosleep",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "exit",
    "exit_group",
    "rt_sigreturn",
    "sigreturn",
    "rt_sigprocmask",
    "getpid",
    "gettid",
    "getuid",
    "getgid",
    "geteuid",
    "getegid",
    "getuid32",
    "getgid32",
    "geteuid32",
    "getegid32",
    "getrandom",
    "sched_yield",
    "restart_syscall",
};

std::string load_seccomp() {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    if (!ctx) return "seccomp_init failed";
    for (const char* name : kAllowedSyscalls) {
        int nr = seccomp_syscall_resolve_name(name);
        if (nr == __NR_SCMP_ERROR) continue;  // not a system call on this architecture
        if (int err = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)) {
            seccomp_release(ctx);
            return std::string("allowing ") + name + ": " + std::strerror(-err);
        }
    }
    int err = seccomp_load(ctx);
    seccomp_release(ctx);
    return err ? std::string("seccomp_load: ") + std::strerror(-err) : std::string();
}

Confinement confine(const json& setup) {
    Confinement c;
    const auto uid = setup.at("uid").get<uid_t>();
    const auto gid = setup.at("gid").get<gid_t>();
    // Another user: fails without CAP_SETUID/CAP_SETGID (an unprivileged agent, a container
    // without them); the capabilities go below either way.
    if (getuid() != uid) {
        if (setgroups(0, nullptr) == 0 || errno == EPERM) {
            if (setresgid(gid, gid, gid) == 0) setresuid(uid, uid, uid);
        }
    }
    __user_cap_header_struct head{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[2] = {};
    c.capabilities_dropped = syscall(SYS_capset, &head, none) == 0;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // no ptrace by others of its user, no core
    c.no_new_privs = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
    auto limit = [](int res, rlim_t v) {
        rlimit r{v, v};
        setrlimit(res, &r);
    };
    limit(RLIMIT_AS, setup.at("address_space").get<rlim_t>());
    limit(RLIMIT_CORE, 0);
    limit(RLIMIT_FSIZE, 0);
    limit(RLIMIT_NOFILE, 8);
    limit(RLIMIT_NPROC, 0);
    c.seccomp_error = load_seccomp();
    c.seccomp = c.seccomp_error.empty();
    return c;
}

bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

}  // namespace

int run_hook_host(int fd) {
    // Only the agent stops it: a stop meant for the agent's whole group (a terminal's Ctrl-C or
    // hang-up, the service manager's SIGTERM, `pkill mpsteer`) would otherwise reach it first
    // and show as a crash the agent restarts it from.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) signal(sig, SIG_IGN);
    // Nothing of the agent's but the socket and the slot (posix_spawn keeps descriptors
    // without CLOEXEC).
    const int first_other = std::max(fd, wire::kSlotFd) + 1;
    if (syscall(SYS_close_range, first_other, ~0U, 0) != 0)
        for (int i = first_other; i < 1024; ++i) close(i);
    void* page = mmap(nullptr, sizeof(wire::RunningSlot), PROT_READ | PROT_WRITE, MAP_SHARED,
                      wire::kSlotFd, 0);
    close(wire::kSlotFd);  // inherited; the mapping keeps the page
    if (page == MAP_FAILED) return 2;
    auto& slot = *static_cast<wire::RunningSlot*>(page);
    try {
        auto setup = wire::receive(fd);
        if (!setup || setup->at("t") != "setup") return 2;
        auto limits = setup->at("limits").get<Limits>();
        spdlog::set_default_logger(
            std::make_shared<spdlog::logger>("hooks", std::make_shared<AgentSink>(fd)));
        spdlog::set_pattern("%v");
        const Confinement c = confine(*setup);
        wire::send(fd, {{"t", "hello"},
                        {"uid", getuid()},
                        {"gid", getgid()},
                        {"no_new_privs", c.no_new_privs},
                        {"seccomp", c.seccomp},
                        {"seccomp_error", c.seccomp_error},
                        {"capabilities_dropped", c.capabilities_dropped}});

        AgentBackend backend(fd);
        HookSet hooks(backend, limits);
        // The position of each policy's script in the last configure: how the slot names it.
        std::map<std::string, uint32_t> spec_index;
        hooks.watch().observe([&](const RunningCall* r) {
            if (!r) return wire::publish(slot, std::nullopt);
            auto it = spec_index.find(r->policy);
            wire::publish(slot, std::pair{it == spec_index.end() ? UINT32_MAX : it->second,
                                          wire::call_index(r->hook)});
        });
        bool gc_left = false;
        for (;;) {
            // The scripts' garbage between requests, one bounded step at a time.
            if (gc_left && !readable(fd)) {
                gc_left = hooks.collect_step();
                continue;
            }
            std::optional<json> m;
            try {
                m = wire::receive(fd);
            } catch (const wire::Error&) {
                return 0;  // the agent closed the socket: its end is ours
            }
            const auto& t = m->at("t").get_ref<const std::string&>();
            json done = {{"t", "done"}};
            if (t == "configure") {
                auto specs = m->at("specs").get<std::vector<ScriptSpec>>();
                spec_index.clear();
                for (uint32_t i = 0; i < specs.size(); ++i) spec_index[specs[i].policy] = i;
                done["loaded"] = hooks.configure(specs, m->at("revision").get<std::string>(),
                                                 m->at("generation").get<uint32_t>());
            } else if (t == "connection") {
                hooks.on_connection(m->at("v").get<Connection>());
            } else if (t == "subflow") {
                hooks.on_subflow(m->at("v").get<Subflow>());
            } else if (t == "subflow_closed") {
                hooks.on_subflow_closed(m->at("v").get<Subflow>());
            } else if (t == "add_addr_blocked") {
                hooks.on_add_addr_blocked(m->at("v").get<AddAddr>());
            } else if (t == "link") {
                hooks.on_link(m->at("v").get<Link>());
            } else if (t == "tick") {
                done["next"] = wire::to_ns(hooks.tick(wire::from_ns(m->at("now").get<int64_t>())));
            } else if (t == "status") {
                done["status"] = hooks.status_json();
            } else if (t == "disable") {
                hooks.disable(m->at("policy").get<std::string>(), m->at("why").get<std::string>());
            } else {
                return 2;
            }
            if (t == "connection" || t == "subflow" || t == "subflow_closed" ||
                t == "add_addr_blocked")
                done["next"] = wire::to_ns(hooks.wake(Clock::now()));
            if (t == "configure" || t == "disable") done["hooks"] = hooks.defined_hooks();
            done["calls"] = hooks.calls();
            done["writes"] = backend.take_returned();
            wire::send(fd, done);
            gc_left = true;
        }
    } catch (const std::exception&) {
        return 1;  // the agent sees the socket close and restarts the process
    }
}

}  // namespace mpsteer::lua
