// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Lua hooks (lua/README.md): operators' scripts that the agent runs on datapath events
// and timers, turning their decisions into in-place map writes. One Lua 5.4 state per script,
// sandboxed: base (without dofile, loadfile, collectgarbage; `load` takes text only), string
// (without dump), table, math, utf8; an instruction budget and a wall-clock limit per call, a
// memory cap per state, the work of C functions (patterns, API calls) charged or bounded, every
// call under a protected call with a traceback, every message leaving a script valid UTF-8 and
// capped; a script failing `max_failures` times in a row is disabled and reported, everything
// else carries on. A call stuck inside C code is the event thread's watchdog's (event_thread.h).
//
// The script API (documented in lua/README.md) reads and writes through a Backend: the agent
// gives one over the datapath's maps (datapath_backend.h), the unit tests a fake that records
// the writes. Nothing here touches the kernel.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

struct lua_State;
typedef int (*lua_CFunction)(lua_State* L);

namespace mpsteer::lua {

struct Limits {
    uint64_t instructions = 1'000'000;  // Lua VM instructions per call (counted per 1000)
    size_t memory_bytes = 16u << 20;    // per state, everything the state allocates
    int max_failures = 3;               // consecutive failed calls before the script is disabled
    // Wall-clock time per call: checked by the count hook, so it stops Lua code; a call stuck
    // inside a C function is stopped by the hook process's kill (hook_process.h).
    std::chrono::milliseconds call_time{1000};
    uint32_t api_calls = 10'000;    // mpsteer.* calls per hook call
    size_t message_bytes = 4096;    // an error, log line or print, beyond: truncated
    uint32_t log_lines_per_s = 50;  // log/print lines per script and second, beyond: dropped
};

// The hook call in progress, readable from any thread (thread-safe): the hook process tells
// the agent which script runs (hook_process.h, through its RunningSlot), the agent shows it
// while a call takes long.
struct RunningCall {
    std::string policy, script, hook;
    std::chrono::steady_clock::time_point since;
};
class CallWatch {
public:
    void begin(RunningCall c);
    void end();
    std::optional<RunningCall> current() const;
    // Called (on the calling thread) with every call as it begins, and with nullptr as it ends.
    void observe(std::function<void(const RunningCall*)> f) { observer_ = std::move(f); }

private:
    mutable std::mutex mu_;
    std::optional<RunningCall> current_;
    std::function<void(const RunningCall*)> observer_;
};

// What a script sees of one subflow. Fields the host cannot know are 0.
struct Subflow {
    uint64_t id = 0;     // handle for set_rate/set_subflow, stable until the flow closes
    uint32_t token = 0;  // the connection (lower of the two MPTCP tokens; 0: unknown)
    std::string a, b;    // endpoints "addr:port" (flow key order: a is the lower one)
    uint64_t bytes = 0, packets = 0;      // payload bytes / packets, both directions
    uint64_t bytes_ab = 0, bytes_ba = 0;  // per direction
    uint32_t srtt_us = 0, rttvar_us = 0;  // TCP_INFO where the host owns the socket,
                                          // else from TCP timestamps (record)
    uint64_t cwnd = 0;                    // bytes (snd_cwnd x mss); local sockets only
    uint64_t inflight = 0;                // bytes sent and not acknowledged; local sockets only
    uint64_t notsent = 0;        // bytes queued on the subflow, not sent; local sockets only
    uint64_t delivery_rate = 0;  // bytes/s (TCP_INFO); local sockets only
    uint64_t rate = 0;           // rate_limit override in bytes/s (0: the step's own rate)
    bool backup = false;         // MP_JOIN B flag / MP_PRIO seen
    bool local = false;          // the host owns the socket (TCP_INFO); "local_socket" in Lua
    bool join = false;           // an MP_JOIN subflow (false: the initial one, or unknown)
    // Local sockets only (TCP_INFO), else empty / 0: this host's address on the subflow, the
    // payload it has received, and the time since data and since an ACK last arrived.
    std::string local_address;
    uint64_t bytes_received = 0;
    uint32_t last_recv_ms = 0, last_ack_ms = 0;
};

struct Connection {
    uint32_t token = 0;    // lower token
    uint32_t token_b = 0;  // the other side's token
    uint64_t bytes = 0, packets = 0;
    uint64_t unsent = 0;  // bytes the local MPTCP socket has not sent yet (0: unknown)
    std::vector<Subflow> subflows;
};

struct AddAddr {
    uint32_t token = 0;   // connection (0: not known yet)
    std::string address;  // "10.0.2.2" / "fd00:2::2"
    uint16_t port = 0;    // 0: none in the option
    uint8_t addr_id = 0;
    std::string subflow;  // the subflow it travelled on, "a <-> b"
};

// An interface of the host going up or down (rtnetlink): up = administratively up and
// running (carrier).
struct Link {
    std::string interface;
    bool up = false;
};

// One of the in-kernel path manager's endpoints (`ip mptcp endpoint`).
struct Endpoint {
    uint32_t id = 0;
    std::string address;    // "10.0.2.1" / "fd00:2::1"
    std::string interface;  // "" when the endpoint names none
    bool subflow = false, signal = false, backup = false;
};

// The settings a script may change on a subflow. Empty optionals: leave alone.
struct SubflowSettings {
    std::optional<uint64_t> rate;  // bytes/s, 0 clears the override
    std::optional<bool> backup;
};

// Where scripts read metrics and send their decisions. Calls may throw std::exception: the
// message becomes a Lua error in the calling script.
class Backend {
public:
    virtual ~Backend() = default;
    virtual std::vector<Connection> connections() = 0;
    virtual std::optional<Connection> connection(uint32_t token) = 0;
    virtual std::optional<Subflow> subflow(uint64_t id) = 0;
    // For `policy`'s script. False: no such subflow (any more).
    virtual bool set_subflow(const std::string& policy, uint64_t id, const SubflowSettings& s) = 0;
    // The settings a hook returned for its subflow: nothing waits for the answer, so a backend
    // in another process may carry them with the call's end instead of a round trip each.
    virtual void set_subflow_returned(const std::string& policy, uint64_t id,
                                      const SubflowSettings& s) {
        set_subflow(policy, id, s);
    }
    // Re-inject a hidden announcement (add_subflow); false when already released or unknown.
    virtual bool add_subflow(const std::string& policy, uint32_t token, uint8_t addr_id) = 0;
    // Hide it again (blk_subflow keeps hiding its retransmissions).
    virtual bool block_address(const std::string& policy, uint32_t token, uint8_t addr_id) = 0;
    // The B flag of `policy`'s set_backup actions, in place (and MP_PRIO sent on subflows
    // that are idle, so the peer hears it). Returns the number of actions changed; the writes
    // themselves may land later (the agent queues them to the generation's one writer).
    // Throws when the policy has none.
    virtual int set_policy_backup(const std::string& policy, bool backup) = 0;
    // True only when the backend knows, without asking the kernel, that the host holds no
    // MPTCP connection now (scripts with idle_every then tick slower).
    virtual bool no_connections() { return false; }
    // The path manager's endpoints, and one of them renewed for `policy`'s script: deleted and
    // added again as it was, so the kernel closes the subflows bound to its address and opens
    // new ones on every connection. False when no endpoint has `address`, or when it was
    // renewed too recently (the backend bounds how often).
    virtual std::vector<Endpoint> endpoints() { throw std::runtime_error("no path manager"); }
    virtual bool renew_endpoint(const std::string& policy, const std::string& address) {
        (void)policy, (void)address;
        throw std::runtime_error("no path manager");
    }
};

// One script: its own state, its failures, its statistics.
struct ScriptSpec {
    std::string policy;  // the manifest's policy name
    std::string name;    // for messages: the script as written ("lua/ecf.lua")
    std::string source;  // the text
    uint32_t every_ms = 0;
    nlohmann::json params = nlohmann::json::object();
    uint32_t idle_every_ms = 0;  // 0: every_ms also without connections
    bool operator==(const ScriptSpec&) const = default;
};

struct ScriptStatus {
    std::string policy, script;
    bool disabled = false;
    bool loaded = false;
    int consecutive_failures = 0;
    uint64_t calls = 0, failures = 0, writes = 0;
    std::string last_error;  // with the traceback
    double last_call_us = 0, max_call_us = 0;
    // What the script last gave mpsteer.set_status: a flat object of names to strings,
    // numbers and booleans, escaped and bounded (kStatusEntries).
    nlohmann::json published = nlohmann::json::object();
    static constexpr size_t kStatusEntries = 32, kStatusKeyBytes = 64, kStatusValueBytes = 256;
    nlohmann::json to_json() const;
};

class Script {
public:
    // Loads and runs the chunk (defining the hooks). A load error is a failure like any other:
    // the script is then disabled at once (it has no hooks to retry).
    // watch (may be null) hears of every call while it runs.
    Script(ScriptSpec spec, Backend& backend, Limits limits = {}, CallWatch* watch = nullptr);
    ~Script();
    Script(const Script&) = delete;
    Script& operator=(const Script&) = delete;

    const ScriptSpec& spec() const { return spec_; }
    const ScriptStatus& status() const { return status_; }
    bool disabled() const { return status_.disabled; }
    // Disabled by a verdict from outside its calls (why becomes its last error).
    void disable(const std::string& why);
    // The chunk defined the hook: hooks are the global functions found when the chunk has run
    // (kept as references, so later changes to the globals do not matter).
    bool has(const char* hook) const;

    // Each returns true when the hook ran without error (also when the script lacks it).
    bool on_connection(const Connection& c);
    bool on_subflow(const Subflow& s);
    bool on_subflow_closed(const Subflow& s);
    bool on_add_addr_blocked(const AddAddr& a);
    bool on_link(const Link& l);
    bool on_tick();
    bool on_apply(const nlohmann::json& info);  // {revision, generation, reloaded}

    // One step of the garbage collector when the state has grown since its last full cycle
    // (calls leave their garbage to it: the event thread runs it between events). True while
    // the cycle it started is not finished.
    bool collect_step();
    size_t memory_bytes() const;  // what the state holds now (the cap counts this)

    // The next on_tick (steady clock); max() without ticks.
    std::chrono::steady_clock::time_point next_tick() const { return next_tick_; }
    void schedule_from(std::chrono::steady_clock::time_point now);
    // The next on_tick set directly; `idle`: the interval it came from was idle_every.
    void schedule_at(std::chrono::steady_clock::time_point t, bool idle) {
        next_tick_ = t;
        idle_tick_ = idle;
    }
    bool idle_tick() const { return idle_tick_; }

    struct Impl;  // the sandboxed Lua state (sandbox.h)
private:
    bool call(const char* hook, std::function<int(lua_State*)> push,
              std::function<void(lua_State*)> returns);
    bool run(lua_CFunction fn, const char* what);
    ScriptSpec spec_;
    ScriptStatus status_;
    CallWatch* watch_ = nullptr;
    std::unique_ptr<Impl> impl_;
    std::chrono::steady_clock::time_point next_tick_ = std::chrono::steady_clock::time_point::max();
    bool idle_tick_ = false;
};

// What runs the scripts of the running revision, as the event thread drives it: the scripts
// in this process (HookSet) or in the unprivileged hook process (HookProcess, hook_process.h).
class Hooks {
public:
    virtual ~Hooks() = default;
    // Makes the set equal to `specs` (after an apply): unchanged scripts keep their state,
    // changed ones are reloaded, removed ones dropped; then on_apply runs on every script
    // with {revision, generation, reloaded}. Returns the policies whose script was (re)loaded.
    virtual std::vector<std::string> configure(const std::vector<ScriptSpec>& specs,
                                               const std::string& revision,
                                               uint32_t generation) = 0;
    virtual void on_connection(const Connection& c) = 0;
    virtual void on_subflow(const Subflow& s) = 0;
    virtual void on_subflow_closed(const Subflow& s) = 0;
    virtual void on_add_addr_blocked(const AddAddr& a) = 0;
    virtual void on_link(const Link& l) = 0;
    // Runs every due on_tick; returns when the next one is due (max(): none). A script with
    // idle_every waits that long instead of every while the backend knows of no connection.
    virtual std::chrono::steady_clock::time_point tick(
        std::chrono::steady_clock::time_point now) = 0;
    // After events: once a connection exists, scripts waiting out idle_every tick at once.
    // Returns when the next tick is due.
    virtual std::chrono::steady_clock::time_point wake(
        std::chrono::steady_clock::time_point now) = 0;
    // Garbage collection between events: one step on a script that needs it; true while some
    // script still has a cycle to finish.
    virtual bool collect_step() = 0;
    virtual uint64_t calls() const = 0;              // hook calls so far, every script
    virtual size_t size() const = 0;                 // scripts that may run
    virtual std::vector<ScriptStatus> status() = 0;  // may ask the process
    nlohmann::json status_json();
    // The call in progress; usable from any thread.
    virtual std::optional<RunningCall> running() const = 0;
};

// The scripts themselves, keyed by policy: one sandboxed Lua state each, in this process.
class HookSet : public Hooks {
public:
    explicit HookSet(Backend& backend, Limits limits = {}) : backend_(backend), limits_(limits) {}
    std::vector<std::string> configure(const std::vector<ScriptSpec>& specs,
                                       const std::string& revision, uint32_t generation) override;
    void on_connection(const Connection& c) override;
    void on_subflow(const Subflow& s) override;
    void on_subflow_closed(const Subflow& s) override;
    void on_add_addr_blocked(const AddAddr& a) override;
    void on_link(const Link& l) override;
    std::chrono::steady_clock::time_point tick(std::chrono::steady_clock::time_point now) override;
    std::chrono::steady_clock::time_point wake(std::chrono::steady_clock::time_point now) override;
    bool collect_step() override;
    uint64_t calls() const override;
    std::vector<ScriptStatus> status() override;
    std::optional<RunningCall> running() const override { return watch_.current(); }
    CallWatch& watch() { return watch_; }

    size_t size() const override { return scripts_.size(); }
    // The hooks (kHookNames) some script that may run defines.
    std::vector<std::string> defined_hooks() const;
    Script* find(const std::string& policy);
    // Disables a policy's script (the agent's verdict: it flooded the writes); false: no such
    // script.
    bool disable(const std::string& policy, const std::string& why);

private:
    template <typename F>
    void each(F&& f);
    Backend& backend_;
    Limits limits_;
    CallWatch watch_;
    std::map<std::string, std::unique_ptr<Script>> scripts_;
};

}  // namespace mpsteer::lua
