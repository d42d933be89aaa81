// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Scripts and the set of them (see hooks.h): loading a script into its sandboxed state,
// calling its hooks, counting its failures and disabling it, its status; the HookSet keeping
// one Script per policy across applies and ticking them. The state itself is sandbox.h's, what
// scripts may call is script_api.h's.
#include "lua/hooks.h"

#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "lua/sandbox.h"
#include "lua/script_api.h"

namespace mpsteer::lua {
using Clock = std::chrono::steady_clock;
using Impl = Script::Impl;

nlohmann::json ScriptStatus::to_json() const {
    return {{"policy", policy},
            {"script", script},
            {"state", disabled ? "disabled" : "running"},
            {"loaded", loaded},
            {"calls", calls},
            {"failures", failures},
            {"consecutive_failures", consecutive_failures},
            {"writes", writes},
            {"last_error", last_error},
            {"last_call_us", last_call_us},
            {"max_call_us", max_call_us},
            {"published", published}};
}

namespace {
// What a script's state starts with: the sandbox's libraries, then the API. Runs protected.
int open_state(lua_State* L) {
    open_sandboxed_libraries(L);
    open_script_api(L);
    return 0;
}

// Runs fn in the sandbox and records the outcome in st: calls, timings, failures, and disabling
// after limits.max_failures in a row.
bool run_recorded(Impl& im, ScriptStatus& st, lua_CFunction fn, const char* what) {
    auto t0 = Clock::now();
    std::optional<std::string> error = run_protected(im, fn);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    ++st.calls;
    st.last_call_us = us;
    st.max_call_us = std::max(st.max_call_us, us);
    if (!error) {
        st.consecutive_failures = 0;
        return true;
    }
    ++st.failures;
    ++st.consecutive_failures;
    st.last_error = std::string(what) + ": " + *error;
    spdlog::warn("lua {} ({}): {}", st.policy, st.script, st.last_error);
    if (st.consecutive_failures >= im.limits.max_failures && !st.disabled) {
        st.disabled = true;
        spdlog::error("lua {} ({}): disabled after {} failures in a row", st.policy, st.script,
                      st.consecutive_failures);
    }
    return false;
}
}  // namespace

void CallWatch::begin(RunningCall c) {
    if (observer_) observer_(&c);
    std::lock_guard lock(mu_);
    current_ = std::move(c);
}

void CallWatch::end() {
    if (observer_) observer_(nullptr);
    std::lock_guard lock(mu_);
    current_.reset();
}

std::optional<RunningCall> CallWatch::current() const {
    std::lock_guard lock(mu_);
    return current_;
}

Script::Script(ScriptSpec spec, Backend& backend, Limits limits, CallWatch* watch)
    : spec_(std::move(spec)), watch_(watch), impl_(std::make_unique<Impl>()) {
    status_.policy = spec_.policy;
    status_.script = spec_.name;
    impl_->owner = this;
    impl_->backend = &backend;
    impl_->limits = limits;
    impl_->chunkname = "@" + spec_.name;
    impl_->L = new_sandboxed_state(*impl_);
    if (!impl_->L) {
        status_.disabled = true;
        status_.last_error = "load: cannot create a Lua state within the memory cap";
        return;
    }
    // A failed setup or chunk leaves no hooks to retry: disabled at once.
    if (!run(open_state, "setup") || !run(load_chunk, "load")) {
        status_.disabled = true;
        spdlog::error("lua {} ({}): disabled", spec_.policy, spec_.name);
        return;
    }
    status_.loaded = true;
    status_.calls = 0;  // setup and the chunk are not hook calls
}

Script::~Script() = default;

bool Script::run(lua_CFunction fn, const char* what) {
    if (watch_) watch_->begin({spec_.policy, spec_.name, what, Clock::now()});
    bool ok = run_recorded(*impl_, status_, fn, what);
    if (watch_) watch_->end();
    return ok;
}

bool Script::has(const char* hook) const {
    int i = hook_index(hook);
    return impl_->L && i >= 0 && impl_->hook_refs[i] != LUA_NOREF;
}

bool Script::collect_step() {
    return collect_garbage_step(*impl_);
}

size_t Script::memory_bytes() const {
    return impl_->used;
}

void Script::disable(const std::string& why) {
    status_.disabled = true;
    status_.last_error = why;
    spdlog::error("lua {} ({}): disabled: {}", spec_.policy, spec_.name, why);
}

void Script::schedule_from(Clock::time_point now) {
    next_tick_ =
        spec_.every_ms ? now + std::chrono::milliseconds(spec_.every_ms) : Clock::time_point::max();
}

namespace {
// The value a hook about one subflow may return: nil, or settings for that subflow.
std::function<void(lua_State*)> settings_return(const char* hook, uint64_t id) {
    return [hook, id](lua_State* L) {
        if (lua_isnil(L, -1)) return;
        if (!lua_istable(L, -1))
            luaL_error(L, "%s must return nothing or a table {rate=, backup=} (got a %s)", hook,
                       luaL_typename(L, -1));
        SubflowSettings s = check_settings(L, -1, hook);
        if (id == 0) luaL_error(L, "%s returned settings but the subflow is unknown", hook);
        apply_returned_settings(L, id, s);
    };
}
}  // namespace

bool Script::call(const char* hook, std::function<int(lua_State*)> push,
                  std::function<void(lua_State*)> returns) {
    if (status_.disabled) return false;
    if (!has(hook)) return true;
    impl_->hook = hook;
    impl_->hook_ref = impl_->hook_refs[hook_index(hook)];
    impl_->push = std::move(push);
    impl_->returns = std::move(returns);
    bool ok = run(run_current_hook, hook);
    impl_->push = nullptr;
    impl_->returns = nullptr;
    return ok;
}

bool Script::on_connection(const Connection& c) {
    uint64_t id = c.subflows.empty() ? 0 : c.subflows.front().id;
    return call(
        "on_connection",
        [&c](lua_State* L) {
            push_connection(L, c);
            return 1;
        },
        settings_return("on_connection", id));
}
bool Script::on_subflow(const Subflow& s) {
    return call(
        "on_subflow",
        [&s](lua_State* L) {
            push_subflow(L, s);
            return 1;
        },
        settings_return("on_subflow", s.id));
}
bool Script::on_subflow_closed(const Subflow& s) {
    return call(
        "on_subflow_closed",
        [&s](lua_State* L) {
            push_subflow(L, s);
            return 1;
        },
        nullptr);
}
bool Script::on_add_addr_blocked(const AddAddr& a) {
    return call(
        "on_add_addr_blocked",
        [&a](lua_State* L) {
            push_add_addr(L, a);
            return 1;
        },
        nullptr);
}
bool Script::on_link(const Link& l) {
    return call(
        "on_link",
        [&l](lua_State* L) {
            push_link(L, l);
            return 1;
        },
        nullptr);
}
bool Script::on_tick() {
    return call(
        "on_tick",
        [this](lua_State* L) {
            lua_pushinteger(L, spec_.every_ms);
            return 1;
        },
        nullptr);
}
bool Script::on_apply(const nlohmann::json& info) {
    return call(
        "on_apply",
        [&info](lua_State* L) {
            push_json(L, info);
            return 1;
        },
        nullptr);
}

// ---- HookSet -------------------------------------------------------------------------------

template <typename F>
void HookSet::each(F&& f) {
    for (auto& [name, s] : scripts_)
        if (!s->disabled()) f(*s);
}

std::vector<std::string> HookSet::configure(const std::vector<ScriptSpec>& specs,
                                            const std::string& revision, uint32_t generation) {
    std::vector<std::string> loaded;
    std::map<std::string, std::unique_ptr<Script>> next;
    auto now = Clock::now();
    for (const auto& spec : specs) {
        auto it = scripts_.find(spec.policy);
        if (it != scripts_.end() && it->second->spec() == spec) {
            next[spec.policy] = std::move(it->second);
            continue;
        }
        spdlog::info("lua {}: loading {}{}", spec.policy, spec.name,
                     it != scripts_.end() ? " (changed)" : "");
        auto s = std::make_unique<Script>(spec, backend_, limits_, &watch_);
        s->schedule_from(now);
        next[spec.policy] = std::move(s);
        loaded.push_back(spec.policy);
    }
    for (const auto& [name, s] : scripts_)
        if (s && !next.count(name)) spdlog::info("lua {}: removed", name);
    scripts_ = std::move(next);
    for (auto& [name, s] : scripts_) {
        bool reloaded = std::find(loaded.begin(), loaded.end(), name) != loaded.end();
        if (!s->disabled())
            s->on_apply(
                {{"revision", revision}, {"generation", generation}, {"reloaded", reloaded}});
    }
    return loaded;
}

void HookSet::on_connection(const Connection& c) {
    each([&](Script& s) { s.on_connection(c); });
}
void HookSet::on_subflow(const Subflow& sf) {
    each([&](Script& s) { s.on_subflow(sf); });
}
void HookSet::on_subflow_closed(const Subflow& sf) {
    each([&](Script& s) { s.on_subflow_closed(sf); });
}
void HookSet::on_add_addr_blocked(const AddAddr& a) {
    each([&](Script& s) { s.on_add_addr_blocked(a); });
}
void HookSet::on_link(const Link& l) {
    each([&](Script& s) { s.on_link(l); });
}

Clock::time_point HookSet::tick(Clock::time_point now) {
    auto next = Clock::time_point::max();
    for (auto& [name, s] : scripts_) {
        if (s->disabled() || !s->spec().every_ms) continue;
        if (s->next_tick() <= now) {
            s->on_tick();
            if (s->disabled()) continue;
            const bool idle = s->spec().idle_every_ms && backend_.no_connections();
            auto every =
                std::chrono::milliseconds(idle ? s->spec().idle_every_ms : s->spec().every_ms);
            auto nt = s->next_tick() + every;  // on the grid: no drift
            if (nt <= now) nt = now + every;   // missed ticks are skipped, not queued
            s->schedule_at(nt, idle);
        }
        next = std::min(next, s->next_tick());
    }
    return next;
}

Clock::time_point HookSet::wake(Clock::time_point now) {
    auto next = Clock::time_point::max();
    bool active = false, checked = false;
    for (auto& [name, s] : scripts_) {
        if (s->idle_tick() && !s->disabled()) {
            if (!checked) active = !backend_.no_connections(), checked = true;
            if (active) s->schedule_at(now, false);
        }
        next = std::min(next, s->next_tick());
    }
    return next;
}

std::vector<std::string> HookSet::defined_hooks() const {
    std::vector<std::string> out;
    for (const char* hook : kHookNames)
        for (const auto& [name, s] : scripts_)
            if (!s->disabled() && s->has(hook)) {
                out.push_back(hook);
                break;
            }
    return out;
}

bool HookSet::collect_step() {
    for (auto& [name, s] : scripts_)
        if (s->collect_step()) return true;
    return false;
}

uint64_t HookSet::calls() const {
    uint64_t n = 0;
    for (const auto& [name, s] : scripts_) n += s->status().calls;
    return n;
}

std::vector<ScriptStatus> HookSet::status() {
    std::vector<ScriptStatus> out;
    for (const auto& [name, s] : scripts_) out.push_back(s->status());
    return out;
}

nlohmann::json Hooks::status_json() {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& s : status()) a.push_back(s.to_json());
    return a;
}

bool HookSet::disable(const std::string& policy, const std::string& why) {
    auto* s = find(policy);
    if (!s) return false;
    s->disable(why);
    return true;
}

Script* HookSet::find(const std::string& policy) {
    auto it = scripts_.find(policy);
    return it == scripts_.end() ? nullptr : it->second.get();
}

}  // namespace mpsteer::lua
