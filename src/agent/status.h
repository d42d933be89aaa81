// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's status model (status.json, the Prometheus text is rendered from it) and its event
// log (events.jsonl). The loop fills AgentStatus from the rollout's outcomes, the rollout gives
// DatapathStatus, the event thread HookStatus; render_status() joins them into the document
// that `mpsteer status`, the metrics and the docs read.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datapath/datapath.h"
#include "lua/hooks.h"

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
};

// The Lua hooks, read on the event thread.
struct HookStatus {
    std::vector<lua::ScriptStatus> scripts;
    nlohmann::json scripts_json = nlohmann::json::array();
    nlohmann::json event_thread = nlohmann::json::object();
};

// events.jsonl: one JSON line per datapath event, after the hooks saw it; and the counts.
// Size-capped: a line that takes the file past `max_bytes` first moves it to events.jsonl.1
// (replacing the previous one), so the log keeps between max_bytes and 2 x max_bytes.
class EventLog {
public:
    static constexpr uint64_t kDefaultMaxBytes = 16ull << 20;
    explicit EventLog(const std::string& path, uint64_t max_bytes = kDefaultMaxBytes);
    void record(const datapath::Event& ev);
    void flush() { out_.flush(); }
    nlohmann::json counts_json() const;

private:
    void open();
    std::string path_;
    uint64_t max_bytes_, size_ = 0;
    std::ofstream out_;
    uint64_t counts_[5] = {};
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
