// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The scripts run in a process of their own, not in the root agent: `mpsteer hook-host`,
// started by the agent with a socketpair and nothing else. Before it reads a script it gives
// up what the agent has: another user (mpsteer-hooks, else nobody), no capabilities,
// no_new_privs, a seccomp filter that leaves it the socket, memory and the clock (no file, no
// network, no process), and an address-space limit for all its scripts together. It holds the
// Lua states (a HookSet); every Backend call its scripts make comes back to the agent as a
// request (hook_wire.h), which the agent checks and carries out itself.
//
// The agent side (HookProcess) bounds what the process can do to it: a call that overruns its
// wall-clock budget (even inside one library call, where Lua's own budget cannot stop it) or
// a process that dies or breaks the protocol is killed and started again; the script that was
// running is disabled with the reason, the others are loaded again (their Lua state starts
// afresh). A script whose writes exceed writes_per_second is refused the excess, and disabled
// when it goes on the next second. Log lines are capped for all scripts together.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lua/hook_wire.h"
#include "net/fd.h"
#include "lua/hooks.h"

namespace mpsteer::lua {

struct HookProcessOptions {
    // The mpsteer binary, run as `EXE hook-host` (the agent: itself; tests: the built one).
    std::string executable = "/proc/self/exe";
    Limits limits;
    // RLIMIT_AS of the hook process: every script's state and the process itself.
    uint64_t address_space = 1ull << 30;
    // Beyond the script's own call_time, before the process is killed.
    std::chrono::milliseconds grace{500};
    uint32_t writes_per_second = 1000;    // per script: rates, announcements, backup flags
    uint32_t log_lines_per_second = 200;  // all scripts together
    int rt_priority =
        0;  // SCHED_FIFO for the process too (the event thread's --events-rt-priority)
};

// What the hook process reported after confining itself, and its history.
struct HookProcessInfo {
    pid_t pid = 0;
    uint32_t uid = 0, gid = 0;
    std::string user;
    bool no_new_privs = false, seccomp = false, capabilities_dropped = false;
    uint64_t address_space = 0;
    uint64_t restarts = 0;
    std::string last_restart;  // why the last restart happened
    uint64_t log_lines_dropped = 0;
    uint64_t writes_refused = 0;
    uint64_t requests = 0;  // sent to it (an event no script has a hook for is not sent)
    nlohmann::json to_json() const;
};

class HookProcess : public Hooks {
public:
    // Starts the process (when it cannot, says why in the log and info(), and configure()
    // tries again). Backend calls are served on the thread that calls this object's methods
    // (the event thread).
    explicit HookProcess(Backend& backend, HookProcessOptions opts = {});
    ~HookProcess() override;
    HookProcess(const HookProcess&) = delete;
    HookProcess& operator=(const HookProcess&) = delete;

    std::vector<std::string> configure(const std::vector<ScriptSpec>& specs,
                                       const std::string& revision, uint32_t generation) override;
    void on_connection(const Connection& c) override;
    void on_subflow(const Subflow& s) override;
    void on_subflow_closed(const Subflow& s) override;
    void on_add_addr_blocked(const AddAddr& a) override;
    void on_link(const Link& l) override;
    std::chrono::steady_clock::time_point tick(std::chrono::steady_clock::time_point now) override;
    std::chrono::steady_clock::time_point wake(std::chrono::steady_clock::time_point now) override;
    bool collect_step() override { return false; }  // the process collects between requests
    uint64_t calls() const override { return calls_; }
    size_t size() const override { return pid_ > 0 ? runnable_ : 0; }
    std::vector<ScriptStatus> status() override;
    std::optional<RunningCall> running() const override;  // any thread

    HookProcessInfo info() const;  // any thread

private:
    struct Disabled {
        std::string source, why;
    };
    void start();
    void stop_process();
    // Sends the request and serves the process until it answers; on an overrun, a death or a
    // protocol breach restarts it (and configures it again) and returns nullopt.
    std::optional<nlohmann::json> exchange(const nlohmann::json& request);
    void restart(const std::string& why);
    nlohmann::json serve_call(const nlohmann::json& call);
    // The policy a call names, when a script of it runs (configured, not disabled); throws.
    const std::string& policy_of(const nlohmann::json& call) const;
    void log_line(const nlohmann::json& m);
    std::vector<ScriptSpec> runnable();  // the specs minus the disabled ones (counted)
    // Whether an event for `hook` is worth a request: some script defines it, or a script
    // ticks slower while idle (the process wakes those after any event).
    bool wanted(const char* hook) const;
    void finish_writes_second();

    Backend& backend_;
    HookProcessOptions opts_;
    // The process's RunningSlot (hook_wire.h): a memfd mapped here and in each process.
    net::Fd slot_fd_;
    wire::RunningSlot* slot_ = nullptr;
    pid_t pid_ = -1;
    net::Fd fd_;
    bool restarting_ = false;
    uint64_t calls_ = 0;
    size_t runnable_ = 0;      // scripts the process was last configured with
    bool idle_ticks_ = false;  // one of them has idle_every
    // The hooks its scripts define, as the process last said (bit i: kHookNames[i]).
    uint32_t defined_hooks_ = 0;
    std::chrono::steady_clock::time_point next_tick_ = std::chrono::steady_clock::time_point::max();
    // What configure() was last given, to configure a restarted process again.
    std::vector<ScriptSpec> specs_;
    std::string revision_;
    uint32_t generation_ = 0;
    std::map<std::string, Disabled> disabled_;  // by policy, while its script is unchanged
    // The write budget: writes per policy in the current second, policies over it last second.
    std::chrono::steady_clock::time_point writes_second_;
    std::map<std::string, uint32_t> writes_;
    std::map<std::string, bool> throttled_, throttled_before_;
    std::vector<std::string> to_disable_;
    std::chrono::steady_clock::time_point log_second_;
    uint32_t log_lines_ = 0;
    mutable std::mutex info_mu_;
    HookProcessInfo info_;
    // Policy and script of each spec the process was last configured with (the slot's `spec`),
    // under info_mu_.
    std::vector<std::pair<std::string, std::string>> slot_names_;
};

// `mpsteer hook-host`: the hook process's main, on the socket at fd 3 and the slot at
// wire::kSlotFd. Returns the exit code.
int run_hook_host(int fd);

}  // namespace mpsteer::lua
