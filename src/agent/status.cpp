// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/status.h"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "agent/agent.h"
#include "agent/lock_file.h"
#include "datapath/kernel_probe.h"
#include "net/address.h"
#include "net/fd.h"
#include "net/text.h"

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

int64_t unix_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// The status file's text. Anything but a regular file of sane size is refused with why (a FIFO
// is opened non-blocking and refused before any read).
constexpr off_t kStatusMaxBytes = 16 << 20;
std::string read_status_text(const std::string& path) {
    net::Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!fd) {
        if (errno == ENOENT)
            throw std::runtime_error("no status at " + path + " (has an agent run here?)");
        throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    }
    struct stat st {};
    std::string why;
    if (fstat(fd.get(), &st))
        why = std::strerror(errno);
    else if (S_ISDIR(st.st_mode))
        why = "is a directory, not a status file";
    else if (!S_ISREG(st.st_mode))
        why = "is not a regular file";
    else if (st.st_size > kStatusMaxBytes)
        why = "is too large for a status (" + std::to_string(st.st_size) + " bytes)";
    std::string text;
    while (why.empty()) {
        char buf[65536];
        ssize_t n = read(fd.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) why = std::strerror(errno);
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > static_cast<size_t>(kStatusMaxBytes)) why = "is too large for a status";
    }
    if (!why.empty()) throw std::runtime_error(path + " " + why);
    return text;
}

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
}
}  // namespace

std::string json_text(const nlohmann::json& j, int indent) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

int runtime_gid() {
    const group* g = getgrnam("mpsteer");
    return g ? static_cast<int>(g->gr_gid) : 0;
}

void write_atomic(const std::string& path, const std::string& text, unsigned mode, int gid) {
    const fs::path dir = fs::path(path).parent_path();
    if (!dir.empty()) fs::create_directories(dir);
    std::string tmp = path + ".XXXXXX";
    net::Fd fd(mkostemp(tmp.data(), O_CLOEXEC));  // O_CREAT|O_EXCL: a planted name is not followed
    // Named by the file, not the random temporary name: the same failure reads the same.
    if (!fd) throw std::runtime_error("writing " + path + ": " + std::strerror(errno));
    bool ok = fchmod(fd.get(), mode) == 0 &&
              (gid < 0 || fchown(fd.get(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) == 0);
    for (size_t off = 0; ok && off < text.size();) {
        ssize_t n = write(fd.get(), text.data() + off, text.size() - off);
        if (n < 0 && errno == EINTR) continue;
        ok = n > 0;
        off += n > 0 ? static_cast<size_t>(n) : 0;
    }
    const int err = errno;
    fd.reset();  // before the rename: the file is whole once it has the name
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = ok ? errno : err;
        unlink(tmp.c_str());
        throw std::runtime_error("writing " + path + ": " + std::strerror(e));
    }
}

EventLog::EventLog(const std::string& path, uint64_t max_bytes)
    : path_(path), max_bytes_(max_bytes) {
    open();
}

EventLog::~EventLog() {
    flush();
}

void EventLog::failed(const std::string& why) {
    fd_.reset();
    pending_.clear();  // not kept: a log that cannot be written must not grow the agent
    if (why != error_)
        spdlog::error("event log {}: {} (events are counted, not written)", path_, why);
    error_ = why;
}

void EventLog::open() {
    fd_.reset();
    last_open_ = std::chrono::steady_clock::now();
    // Created 0640 like the status; appended to. O_NOFOLLOW: never through a planted link;
    // O_NONBLOCK: a planted FIFO fails here instead of blocking the loop.
    net::Fd fd(::open(path_.c_str(),
                      O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0640));
    if (!fd) {
        failed(errno == ELOOP ? "is a symbolic link, not followed" : std::strerror(errno));
        return;
    }
    struct stat st {};
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        failed("is not a regular file");
        return;
    }
    fd_ = std::move(fd);
    size_ = static_cast<uint64_t>(st.st_size);
    if (!error_.empty()) spdlog::info("event log {}: written again", path_);
    error_.clear();
}

void EventLog::flush() {
    if (!fd_ && std::chrono::steady_clock::now() - last_open_ >= std::chrono::seconds(1)) open();
    if (!fd_) {
        pending_.clear();
        return;
    }
    for (size_t off = 0; off < pending_.size();) {
        ssize_t n = write(fd_.get(), pending_.data() + off, pending_.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            failed(std::strerror(n < 0 ? errno : EIO));
            return;
        }
        off += static_cast<size_t>(n);
    }
    pending_.clear();
}

void EventLog::record(const datapath::Event& ev) {
    const auto& r = ev.raw;
    nlohmann::json j = {
        {"time", now_iso()},
        {"flow", datapath::to_string(r.flow)},
        {"hook", std::string(datapath::to_string(static_cast<datapath::Hook>(r.hook)))}};
    if (r.type < MPS_EV_MAX) ++counts_[r.type];
    const auto fields = datapath::decode(r);
    j["type"] = fields.type;
    switch (r.type) {
    case MPS_EV_MP_CAPABLE:
        j["version"] = r.version;
        if (ev.token_a) j["token_a"] = hex32(ev.token_a);
        if (ev.token_b) j["token_b"] = hex32(ev.token_b);
        break;
    case MPS_EV_MP_JOIN:
        j["token"] = hex32(r.token);
        j["backup"] = fields.backup;
        j["addr_id"] = r.addr_id;
        break;
    case MPS_EV_ADD_ADDR_BLOCKED:
        j["address"] = fields.address;
        j["addr_id"] = r.addr_id;
        if (fields.port) j["port"] = fields.port;
        break;
    case MPS_EV_FLOW_CLOSED:
        if (fields.reset) j["reset"] = true;
        break;
    default: break;
    }
    const std::string line = json_text(j) + '\n';
    if (size_ > 0 && size_ + line.size() > max_bytes_) {
        flush();
        ::rename(path_.c_str(), (path_ + ".1").c_str());
        open();
    }
    if (!fd_) return;
    pending_ += line;
    size_ += line.size();
    if (pending_.size() >= 64 * 1024) flush();
}

nlohmann::json EventLog::counts_json() const {
    return {{"mp_capable", counts_[MPS_EV_MP_CAPABLE]},
            {"mp_join", counts_[MPS_EV_MP_JOIN]},
            {"flow_closed", counts_[MPS_EV_FLOW_CLOSED]},
            {"add_addr_blocked", counts_[MPS_EV_ADD_ADDR_BLOCKED]}};
}

namespace {
// Every string of the status may carry policy text (names, messages, script errors): escaped
// here, once, so `mpsteer status` and whatever reads the file print it as one line.
void escape_strings(nlohmann::json& j) {
    if (j.is_string())
        j = net::escape_control(j.get_ref<const std::string&>());
    else if (j.is_structured())
        for (auto& v : j) escape_strings(v);
}
}  // namespace

nlohmann::json render_status(const AgentStatus& a, const DatapathStatus& dp,
                             const HookStatus& hooks, const EventLog& events,
                             const std::string& policies_dir) {
    const bool stalled = a.stall != Stall::none;
    const Readiness readiness = a.suspended   ? Readiness::suspended
                                : !dp.running ? Readiness::nothing_applied
                                : stalled     ? Readiness::stalled
                                              : Readiness::applied;
    const bool ready = readiness == Readiness::applied;
    nlohmann::json conds = nlohmann::json::array();
    conds.push_back(
        {{"type", "Ready"},
         {"status", ready},
         {"reason", readiness == Readiness::stalled ? to_string(a.stall) : to_string(readiness)},
         {"message", ready         ? "revision " + a.applied_revision + " is active"
                     : a.suspended ? "applying is suspended (mpsteer resume)"
                                   : a.stall_message}});
    conds.push_back({{"type", "Stalled"},
                     {"status", stalled},
                     {"reason", to_string(a.stall)},
                     {"message", a.stall_message}});
    std::string hook_off;  // a disabled script degrades the agent
    for (const auto& h : hooks.scripts)
        if (h.disabled)
            hook_off += (hook_off.empty() ? "" : ", ") + h.policy + " (" + h.script + ")";
    const uint64_t missed = dp.missed_tail_calls;
    const Degradation degradation = missed                ? Degradation::missed_tail_calls
                                    : !a.warnings.empty() ? Degradation::warnings
                                    : !hook_off.empty()   ? Degradation::lua_hook_disabled
                                                          : Degradation::none;
    std::string degraded_message;
    switch (degradation) {
    case Degradation::missed_tail_calls:
        degraded_message = std::to_string(missed) + " missed tail calls";
        break;
    case Degradation::warnings: degraded_message = a.warnings.front(); break;
    case Degradation::lua_hook_disabled: degraded_message = "Lua hook disabled: " + hook_off; break;
    case Degradation::none: break;
    }
    conds.push_back({{"type", "Degraded"},
                     {"status", degradation != Degradation::none},
                     {"reason", to_string(degradation)},
                     {"message", degraded_message}});
    // The state files: the status itself (its failures show once it is written again) and the
    // event log.
    std::string state_message;
    if (a.status_write_failures)
        state_message = "status.json could not be written " +
                        std::to_string(a.status_write_failures) +
                        " times (last: " + a.last_status_write_error + ")";
    if (!events.error().empty())
        state_message +=
            (state_message.empty() ? "" : "; ") + std::string("events.jsonl ") + events.error();
    const bool state_ok = a.status_write_error.empty() && events.error().empty();
    conds.push_back({{"type", "StateWritable"},
                     {"status", state_ok},
                     {"reason", !events.error().empty()   ? "EventLogUnwritable"
                                : a.status_write_failures ? "StatusWriteFailed"
                                                          : ""},
                     {"message", state_message}});
    const auto& g = dp.totals.values;
    nlohmann::json gen_counters = {{"packets", g[MPS_GC_PACKETS]},
                                   {"not_tcp", g[MPS_GC_NOT_TCP]},
                                   {"malformed", g[MPS_GC_MALFORMED]},
                                   {"missed_tail_calls", g[MPS_GC_MISSED_TAIL_CALL]},
                                   {"chain_too_long", g[MPS_GC_CHAIN_TOO_LONG]},
                                   {"events_lost", g[MPS_GC_EVENTS_LOST]},
                                   {"unparseable_drops", g[MPS_GC_UNPARSEABLE_DROPS]}};
    nlohmann::json policies = nlohmann::json::array();
    for (const auto& [name, c] : dp.policies)
        policies.push_back({{"name", name},
                            {"selected", c.selected},
                            {"applied", c.applied},
                            {"drops", c.drops},
                            {"missed_tail_calls", c.missed_tail_calls}});
    nlohmann::json links = nlohmann::json::array();
    for (const auto& l : dp.links) {
        auto& j = links.emplace_back(nlohmann::json{{"interface", l.interface},
                                                    {"hook", l.hook},
                                                    {"mode", l.mode},
                                                    {"compiled_entry", l.compiled}});
        if (!l.refused.empty()) j["compiled_entry_refused"] = l.refused;
    }
    nlohmann::json tables = nlohmann::json::object();
    for (const auto& t : dp.tables) {
        auto& j = tables[t.name] = {{"capacity", t.capacity}, {"memory_bytes", t.memory_bytes}};
        if (t.entries) j["entries"] = *t.entries;
        if (t.evictions) j["evictions"] = *t.evictions;
    }
    nlohmann::json status = {
        {"ready", ready},
        {"suspended", a.suspended},
        {"pending", a.pending},
        {"conditions", conds},
        {"applied_revision", a.applied_revision},
        {"attempted_revision", a.attempted_revision},
        {"generation", dp.generation},
        {"policies", policies},
        {"attachments", links},
        // Which build of the datapath runs (bpf/README.md, "Two builds of the datapath").
        {"datapath_without_btf", datapath::why_datapath_without_btf()},
        {"datapath", gen_counters},
        {"tables", tables},
        {"balancer", dp.balancer},
        {"errors", a.errors},
        {"warnings", a.warnings},
        {"applies",
         {{"succeeded", a.applies_succeeded},
          {"failed", a.applies_failed},
          {"last_duration_ms", a.last_apply_ms}}},
        {"events", events.counts_json()},
        {"state_files",
         {{"status_write_failures", a.status_write_failures}, {"event_log_error", events.error()}}},
        {"lua_hooks", hooks.scripts_json},
        {"event_thread", hooks.event_thread},
        {"hook_process", hooks.process},
        {"endpoint_renewals", hooks.paths},
        {"pid", getpid()},
        {"policies_dir", policies_dir},
        {"updated", now_iso()},
        {"updated_unix_ms", unix_ms()}};
    escape_strings(status);
    return status;
}

nlohmann::json read_status(const std::string& state_dir) {
    const std::string path = status_path(state_dir);
    nlohmann::json s = nlohmann::json::parse(read_status_text(path), nullptr, false);
    if (s.is_discarded() || !s.is_object())
        throw std::runtime_error(path + " is not a status document (not a JSON object)");
    if (!s["conditions"].is_array()) s["conditions"] = nlohmann::json::array();
    auto not_ready = [&](const char* type, const char* reason, const std::string& message) {
        s["ready"] = false;
        s["conditions"].push_back(
            {{"type", type}, {"status", false}, {"reason", reason}, {"message", message}});
    };
    const bool running = AgentLock::held(state_dir);
    s["agent_running"] = running;
    if (!running) {
        not_ready("AgentRunning", "NotRunning",
                  "no agent runs; the datapath keeps the last generation");
        return s;
    }
    // A live agent that stopped writing is frozen: not ready.
    const auto written = s.find("updated_unix_ms");
    const bool has_time = written != s.end() && written->is_number();
    const int64_t age_ms = has_time ? unix_ms() - written->get<int64_t>() : 0;
    s["age_seconds"] = age_ms / 1000.0;
    if (!has_time || age_ms > kStatusStaleAfterSeconds * 1000)
        not_ready("Fresh", "StatusStale",
                  !has_time ? "the status carries no write time"
                            : "the agent last wrote its status " + std::to_string(age_ms / 1000) +
                                  " s ago (it writes every second)");
    return s;
}

}  // namespace mpsteer::agent
