// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's status model (status.json, the Prometheus text is rendered from it) and its event
// log (events.jsonl). The loop fills AgentStatus from the rollout's outcomes, the rollout gives
// DatapathStatus, the event thread HookStatus; render_status() joins them into the document
// that `mpsteer status`, the metrics and the docs read.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datapath/datapath.h"
#include "lua/hooks.h"
#include "net/fd.h"

namespace mpsteer::agent {

// Why the last attempted revision does not run (the Stalled condition's reason).
enum class Stall {
    none,
    source_unavailable,
    validation_failed,
    compile_failed,
    build_failed,
    switch_failed
};
const char* to_string(Stall s);  // "" for none

// The Ready condition: applied, or why not.
enum class Readiness { applied, suspended, nothing_applied, stalled };
const char* to_string(Readiness r);

// The Degraded condition's reason (the first that holds, in this order).
enum class Degradation { none, missed_tail_calls, warnings, lua_hook_disabled };
const char* to_string(Degradation d);  // "" for none

// What the loop knows: the revisions and the outcome of the last attempt.
struct AgentStatus {
    std::string applied_revision, attempted_revision;
    Stall stall = Stall::none;
    std::string stall_message;
    std::vector<std::string> errors, warnings;  // of the last attempted revision
    bool suspended = false, pending = false;
    uint64_t applies_succeeded = 0, applies_failed = 0;
    double last_apply_ms = 0;
    // A status that could not be written (a full or read-only state directory) is retried every
    // second; the count and the last reason show once it can be written again.
    uint64_t status_write_failures = 0;
    std::string status_write_error;  // the last failure; "" while the last write succeeded
    std::string last_status_write_error;
};

struct PolicyCounters {
    uint64_t selected = 0, applied = 0, drops = 0, missed_tail_calls = 0;
    PolicyCounters& operator+=(const PolicyCounters& o);
};

// What runs in the kernel, as the rollout reports it.
struct DatapathStatus {
    bool running = false;  // a generation is active
    uint32_t generation = 0;
    std::map<std::string, PolicyCounters> policies;  // the running policies, totals since start
    datapath::GenCounters totals;                    // every generation since start
    uint64_t missed_tail_calls = 0;                  // the running generation's
    struct Link {
        std::string interface, hook, mode;
        bool compiled = false;  // runs its chain's compiled entry (else the entry program)
        std::string refused;    // why the kernel refused the compiled entry, "" if it did not
    };
    std::vector<Link> links;
    std::vector<datapath::TableInfo> tables;  // the state tables' sizes and memory
    nlohmann::json balancer;                  // BalancerHost::status(); null: none runs
};

// The Lua hooks, read on the event thread.
struct HookStatus {
    std::vector<lua::ScriptStatus> scripts;
    nlohmann::json scripts_json = nlohmann::json::array();
    nlohmann::json event_thread = nlohmann::json::object();
    nlohmann::json process = nlohmann::json::object();  // lua::HookProcessInfo
    nlohmann::json paths = nlohmann::json::array();     // DatapathBackend::paths_json()
};

// events.jsonl: one JSON line per datapath event, after the hooks saw it; and the counts.
// Size-capped: a line that takes the file past `max_bytes` first moves it to events.jsonl.1
// (replacing the previous one), so the log keeps between max_bytes and 2 x max_bytes.
// Only ever a regular file: a link planted at its name is not followed. A file that cannot be
// opened or written is reported (error()) and tried again at most once a second; events meanwhile
// are counted, not written.
class EventLog {
public:
    static constexpr uint64_t kDefaultMaxBytes = 16ull << 20;
    explicit EventLog(const std::string& path, uint64_t max_bytes = kDefaultMaxBytes);
    ~EventLog();
    EventLog(const EventLog&) = delete;
    EventLog& operator=(const EventLog&) = delete;
    void record(const datapath::Event& ev);
    void flush();
    nlohmann::json counts_json() const;
    const std::string& error() const { return error_; }  // "" while the file is written

private:
    void open();
    void failed(const std::string& why);
    std::string path_;
    uint64_t max_bytes_, size_ = 0;
    net::Fd fd_;
    std::string pending_;  // lines not written yet
    std::string error_;
    std::chrono::steady_clock::time_point last_open_{};
    uint64_t counts_[MPS_EV_MAX] = {};
};

// How long a status may go unwritten before `mpsteer status` calls the agent frozen (the loop
// writes it every second).
constexpr int kStatusStaleAfterSeconds = 10;

nlohmann::json render_status(const AgentStatus& agent, const DatapathStatus& dp,
                             const HookStatus& hooks, const EventLog& events,
                             const std::string& policies_dir);

// JSON text of a runtime document (status, event line, CLI output). Strings that are not
// UTF-8 (a script's error, an interface or file name) are replaced, never thrown on.
std::string json_text(const nlohmann::json& j, int indent = -1);

// Writes through a temporary file created next to `path` (mkstemp: never follows a planted
// link) and a rename: readers never see half a file. The file gets `mode` and, when gid >= 0,
// that group.
void write_atomic(const std::string& path, const std::string& text, unsigned mode = 0644,
                  int gid = -1);

// Runtime files readable by root and the `mpsteer` group only: the group's id, else root's.
int runtime_gid();

}  // namespace mpsteer::agent
