#include "agent/status.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "agent/agent.h"
#include "agent/lock_file.h"
#include "net/address.h"

namespace fs = std::filesystem;

namespace mpsteer::agent {

const char* to_string(Stall s) {
    switch (s) {
    case Stall::none: return "";
    case Stall::source_unavailable: return "SourceUnavailable";
    case Stall::validation_failed: return "ValidationFailed";
    case Stall::compile_failed: return "CompileFailed";
    case Stall::build_failed: return "BuildFailed";
    case Stall::switch_failed: return "SwitchFailed";
    }
    return "";
}

const char* to_string(Readiness r) {
    switch (r) {
    case Readiness::applied: return "Applied";
    case Readiness::suspended: return "Suspended";
    case Readiness::nothing_applied: return "NothingApplied";
    case Readiness::stalled: return "Stalled";
    }
    return "";
}

const char* to_string(Degradation d) {
    switch (d) {
    case Degradation::none: return "";
    case Degradation::missed_tail_calls: return "MissedTailCalls";
    case Degradation::warnings: return "Warnings";
    case Degradation::lua_hook_disabled: return "LuaHookDisabled";
    }
    return "";
}

PolicyCounters& PolicyCounters::operator+=(const PolicyCounters& o) {
    selected += o.selected, applied += o.applied, drops += o.drops;
    missed_tail_calls += o.missed_tail_calls;
    return *this;
}

namespace {
std::string now_iso() {
    auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
}
}  // namespace

void write_atomic(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << text;
        if (!out) throw std::runtime_error("writing " + tmp);
    }
    fs::rename(tmp, path);
}

EventLog::EventLog(const std::string& path) : out_(path, std::ios::app) {}

void EventLog::record(const datapath::Event& ev) {
    const auto& r = ev.raw;
    nlohmann::json j = {{"time", now_iso()}, {"flow", datapath::to_string(r.flow)},
                        {"hook", std::string(datapath::to_string(static_cast<datapath::Hook>(r.hook)))}};
    if (r.type < 5) ++counts_[r.type];
    if (r.type == MPS_EV_MP_CAPABLE) {
        j["type"] = "mp_capable";
        j["version"] = r.version;
        if (ev.token_a) j["token_a"] = hex32(ev.token_a);
        if (ev.token_b) j["token_b"] = hex32(ev.token_b);
    } else if (r.type == MPS_EV_MP_JOIN) {
        j["type"] = "mp_join";
        j["token"] = hex32(r.token);
        j["backup"] = bool(r.flags & 1);
        j["addr_id"] = r.addr_id;
    } else if (r.type == MPS_EV_ADD_ADDR_BLOCKED) {
        j["type"] = "add_addr_blocked";
        j["address"] = net::address_text(r.flags == 6 ? 6 : 4, r.key);
        j["addr_id"] = r.addr_id;
        if (r.nonce) j["port"] = r.nonce;
    } else {
        j["type"] = "flow_closed";
    }
    out_ << j.dump() << '\n';
}

nlohmann::json EventLog::counts_json() const {
    return {{"mp_capable", counts_[MPS_EV_MP_CAPABLE]},
            {"mp_join", counts_[MPS_EV_MP_JOIN]},
            {"flow_closed", counts_[MPS_EV_FLOW_CLOSED]},
            {"add_addr_blocked", counts_[MPS_EV_ADD_ADDR_BLOCKED]}};
}

nlohmann::json render_status(const AgentStatus& a, const DatapathStatus& dp,
                             const HookStatus& hooks, const EventLog& events,
                             const std::string& policies_dir) {
    const bool stalled = a.stall != Stall::none;
    const Readiness readiness = a.suspended    ? Readiness::suspended
                                : !dp.running  ? Readiness::nothing_applied
                                : stalled      ? Readiness::stalled
                                               : Readiness::applied;
    const bool ready = readiness == Readiness::applied;
    nlohmann::json conds = nlohmann::json::array();
    conds.push_back({{"type", "Ready"},
                     {"status", ready},
                     {"reason", readiness == Readiness::stalled ? to_string(a.stall) : to_string(readiness)},
                     {"message", ready ? "revision " + a.applied_revision + " is active"
                                 : a.suspended ? "applying is suspended (mpsteer resume)"
                                               : a.stall_message}});
    conds.push_back({{"type", "Stalled"},
                     {"status", stalled},
                     {"reason", to_string(a.stall)},
                     {"message", a.stall_message}});
    std::string hook_off;  // a disabled script degrades the agent
    for (const auto& h : hooks.scripts)
        if (h.disabled) hook_off += (hook_off.empty() ? "" : ", ") + h.policy + " (" + h.script + ")";
    const uint64_t missed = dp.missed_tail_calls;
    const Degradation degradation = missed                ? Degradation::missed_tail_calls
                                    : !a.warnings.empty() ? Degradation::warnings
                                    : !hook_off.empty()   ? Degradation::lua_hook_disabled
                                                          : Degradation::none;
    std::string degraded_message;
    switch (degradation) {
    case Degradation::missed_tail_calls: degraded_message = std::to_string(missed) + " missed tail calls"; break;
    case Degradation::warnings: degraded_message = a.warnings.front(); break;
    case Degradation::lua_hook_disabled: degraded_message = "Lua hook disabled: " + hook_off; break;
    case Degradation::none: break;
    }
    conds.push_back({{"type", "Degraded"},
                     {"status", degradation != Degradation::none},
                     {"reason", to_string(degradation)},
                     {"message", degraded_message}});
    const auto& g = dp.totals.values;
    nlohmann::json gen_counters = {{"packets", g[MPS_GC_PACKETS]},
                                   {"not_tcp", g[MPS_GC_NOT_TCP]},
                                   {"malformed", g[MPS_GC_MALFORMED]},
                                   {"missed_tail_calls", g[MPS_GC_MISSED_TAIL_CALL]},
                                   {"chain_too_long", g[MPS_GC_CHAIN_TOO_LONG]},
                                   {"no_meta", g[MPS_GC_NO_META]},
                                   {"events_lost", g[MPS_GC_EVENTS_LOST]}};
    nlohmann::json policies = nlohmann::json::array();
    for (const auto& [name, c] : dp.policies)
        policies.push_back({{"name", name},
                            {"selected", c.selected},
                            {"applied", c.applied},
                            {"drops", c.drops},
                            {"missed_tail_calls", c.missed_tail_calls}});
    nlohmann::json links = nlohmann::json::array();
    for (const auto& l : dp.links)
        links.push_back({{"interface", l.interface}, {"hook", l.hook}, {"mode", l.mode}});
    return {{"ready", ready},
            {"suspended", a.suspended},
            {"pending", a.pending},
            {"conditions", conds},
            {"applied_revision", a.applied_revision},
            {"attempted_revision", a.attempted_revision},
            {"generation", dp.generation},
            {"policies", policies},
            {"attachments", links},
            {"datapath", gen_counters},
            {"errors", a.errors},
            {"warnings", a.warnings},
            {"applies", {{"succeeded", a.applies_succeeded}, {"failed", a.applies_failed},
                         {"last_duration_ms", a.last_apply_ms}}},
            {"events", events.counts_json()},
            {"lua_hooks", hooks.scripts_json},
            {"event_thread", hooks.event_thread},
            {"pid", getpid()},
            {"policies_dir", policies_dir},
            {"updated", now_iso()}};
}

nlohmann::json read_status(const std::string& state_dir) {
    std::ifstream in(status_path(state_dir));
    if (!in) throw std::runtime_error("no status in " + state_dir + " (has an agent run here?)");
    nlohmann::json s;
    in >> s;
    const bool running = AgentLock::held(state_dir);
    s["agent_running"] = running;
    if (!running) {
        s["ready"] = false;
        s["conditions"].push_back({{"type", "AgentRunning"},
                                   {"status", false},
                                   {"reason", "NotRunning"},
                                   {"message", "no agent runs; the datapath keeps the last generation"}});
    }
    return s;
}

}  // namespace mpsteer::agent
