// The Lua side of the hooks. Lua is C and raises errors with longjmp: every function here that
// can raise a Lua error holds no C++ object with a destructor at the moment it raises (messages
// go through fixed buffers, temporaries live in Impl), and everything that allocates inside
// the state runs under a protected call, so the memory cap can never reach lua_atpanic.
#include "lua/hooks.h"

#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>
#include <lua5.4/lualib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "manifest/manifest.h"

namespace mpsteer::lua {
using Clock = std::chrono::steady_clock;

struct Script::Impl {
    lua_State* L = nullptr;
    Script* owner = nullptr;
    Backend* backend = nullptr;
    Limits limits;
    size_t used = 0;
    bool headroom = false;     // the error handler may exceed the cap a little
    bool oom = false;          // the cap refused an allocation during this call
    bool over_budget = false;  // the instruction budget ran out during this call
    uint64_t budget_left = 0;  // in units of 1000 instructions
    // The call in progress (read by the trampoline).
    const char* hook = nullptr;
    std::function<int(lua_State*)> push;      // pushes the arguments, returns how many
    std::function<void(lua_State*)> returns;  // checks/uses the value on top (may raise)
    // Temporaries the API functions fill before pushing (never locals: see the top).
    std::vector<Connection> conns;
    std::optional<Connection> conn;
    std::optional<Subflow> sf;
    std::string tmp;
    char err[512] = {};
    size_t gc_base = 0;     // bytes in use after the last full cycle collect_step finished
    bool gc_cycle = false;  // collect_step is in a cycle
    int gc_cycles = 0;      // cycles it finished since it began

    ~Impl() {
        if (L) {
            budget_left = 1;  // finalizers run at close: keep them bounded
            over_budget = true;
            lua_close(L);
        }
    }
};

namespace {
using Impl = Script::Impl;

Impl* impl_of(lua_State* L) { return *static_cast<Impl**>(lua_getextraspace(L)); }

void* capped_alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
    auto* im = static_cast<Impl*>(ud);
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        std::free(ptr);
        im->used -= old;
        return nullptr;
    }
    size_t cap = im->limits.memory_bytes + (im->headroom ? (256u << 10) : 0);
    if (nsize > old && im->used + (nsize - old) > cap) {
        im->oom = true;
        return nullptr;
    }
    void* p = std::realloc(ptr, nsize);
    if (p) im->used = im->used - old + nsize;
    return p;
}

void count_hook(lua_State* L, lua_Debug*) {
    Impl* im = impl_of(L);
    if (im->budget_left > 0 && --im->budget_left > 0) return;
    if (!im->over_budget) {
        im->over_budget = true;
        im->budget_left = 50;  // room for the error handler's traceback
    }
    luaL_error(L, "instruction budget exceeded (%I instructions)",
               static_cast<lua_Integer>(im->limits.instructions));
}

// Message handler: the error with a traceback.
int traceback(lua_State* L) {
    Impl* im = impl_of(L);
    im->headroom = true;
    const char* msg = lua_tostring(L, 1);
    if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    luaL_traceback(L, L, msg, 1);
    return 1;
}

// pcall/xpcall that cannot swallow the budget or the memory cap.
int sb_pcall(lua_State* L) {
    luaL_checkany(L, 1);
    int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    Impl* im = impl_of(L);
    if (st != LUA_OK && (im->over_budget || im->oom)) return lua_error(L);
    lua_pushboolean(L, st == LUA_OK);
    lua_insert(L, 1);
    return lua_gettop(L);
}

int sb_xpcall(lua_State* L) {
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 1);  // f
    lua_pushvalue(L, 2);  // msgh
    lua_replace(L, 1);    // 1 = msgh
    lua_replace(L, 2);    // 2 = f
    int st = lua_pcall(L, n - 2, LUA_MULTRET, 1);
    Impl* im = impl_of(L);
    if (st != LUA_OK && (im->over_budget || im->oom)) return lua_error(L);
    lua_pushboolean(L, st == LUA_OK);
    lua_replace(L, 1);
    return lua_gettop(L);
}

// load(text [, chunkname [, mode [, env]]]): text only, never bytecode.
int sb_load(lua_State* L) {
    size_t len;
    const char* s = lua_tolstring(L, 1, &len);
    if (!s) return luaL_error(L, "load: the chunk must be a string (readers are not allowed)");
    const char* name = luaL_optstring(L, 2, "=(load)");
    const char* mode = luaL_optstring(L, 3, "t");
    if (std::strcmp(mode, "t") != 0)
        return luaL_error(L, "load: mode '%s' is not allowed (text chunks only)", mode);
    bool env = !lua_isnoneornil(L, 4);
    if (luaL_loadbufferx(L, s, len, name, "t") != LUA_OK) {
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    if (env) {
        lua_pushvalue(L, 4);
        if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    }
    return 1;
}

// string.rep that cannot spin in C or allocate beyond the cap.
int sb_rep(lua_State* L) {
    size_t l, lsep = 0;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    Impl* im = impl_of(L);
    if (n > 0 && l + lsep == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    if (n > 0 && double(n) * double(l + lsep) > double(im->limits.memory_bytes))
        return luaL_error(L, "string.rep: result beyond the memory cap");
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

int sb_print(lua_State* L) {
    Impl* im = impl_of(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int n = lua_gettop(L);
    for (int i = 1; i <= n; ++i) {
        luaL_tolstring(L, i, nullptr);
        luaL_addvalue(&b);
        if (i < n) luaL_addchar(&b, '\t');
    }
    luaL_pushresult(&b);
    spdlog::info("lua {}: {}", im->owner->spec().policy, lua_tostring(L, -1));
    return 0;
}

// ---- conversions ---------------------------------------------------------------------------

void set_int(lua_State* L, const char* k, uint64_t v) {
    lua_pushinteger(L, static_cast<lua_Integer>(v));
    lua_setfield(L, -2, k);
}
void set_str(lua_State* L, const char* k, const std::string& v) {
    lua_pushlstring(L, v.data(), v.size());
    lua_setfield(L, -2, k);
}
void set_bool(lua_State* L, const char* k, bool v) {
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

void push_subflow(lua_State* L, const Subflow& s) {
    lua_createtable(L, 0, 20);
    set_int(L, "id", s.id);
    set_int(L, "token", s.token);
    set_str(L, "a", s.a);
    set_str(L, "b", s.b);
    set_int(L, "bytes", s.bytes);
    set_int(L, "packets", s.packets);
    set_int(L, "bytes_ab", s.bytes_ab);
    set_int(L, "bytes_ba", s.bytes_ba);
    set_int(L, "srtt_us", s.srtt_us);
    set_int(L, "rttvar_us", s.rttvar_us);
    set_int(L, "cwnd", s.cwnd);
    set_int(L, "inflight", s.inflight);
    set_int(L, "notsent", s.notsent);
    set_int(L, "delivery_rate", s.delivery_rate);
    set_int(L, "rate", s.rate);
    set_bool(L, "backup", s.backup);
    set_bool(L, "local_socket", s.local);
    set_bool(L, "join", s.join);
}

void push_conn(lua_State* L, const Connection& c) {
    lua_createtable(L, 0, 8);
    set_int(L, "token", c.token);
    set_int(L, "token_b", c.token_b);
    set_int(L, "bytes", c.bytes);
    set_int(L, "packets", c.packets);
    set_int(L, "unsent", c.unsent);
    lua_createtable(L, static_cast<int>(c.subflows.size()), 0);
    for (size_t i = 0; i < c.subflows.size(); ++i) {
        push_subflow(L, c.subflows[i]);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    lua_setfield(L, -2, "subflows");
}

void push_json(lua_State* L, const nlohmann::json& j, int depth = 0) {
    if (depth > 16) luaL_error(L, "params nested too deeply");
    switch (j.type()) {
    case nlohmann::json::value_t::boolean: lua_pushboolean(L, j.get<bool>()); break;
    case nlohmann::json::value_t::number_integer: lua_pushinteger(L, j.get<int64_t>()); break;
    case nlohmann::json::value_t::number_unsigned:
        lua_pushinteger(L, static_cast<lua_Integer>(j.get<uint64_t>()));
        break;
    case nlohmann::json::value_t::number_float: lua_pushnumber(L, j.get<double>()); break;
    case nlohmann::json::value_t::string: {
        const auto& s = j.get_ref<const std::string&>();
        lua_pushlstring(L, s.data(), s.size());
        break;
    }
    case nlohmann::json::value_t::array: {
        lua_createtable(L, static_cast<int>(j.size()), 0);
        lua_Integer i = 1;
        for (const auto& v : j) {
            push_json(L, v, depth + 1);
            lua_rawseti(L, -2, i++);
        }
        break;
    }
    case nlohmann::json::value_t::object:
        lua_createtable(L, 0, static_cast<int>(j.size()));
        for (const auto& [k, v] : j.items()) {
            push_json(L, v, depth + 1);
            lua_setfield(L, -2, k.c_str());
        }
        break;
    default: lua_pushnil(L);
    }
}

// A non-negative integer from a number argument (floats are rounded).
uint64_t check_u64(lua_State* L, int idx, const char* what) {
    int isnum = 0;
    lua_Number v = lua_tonumberx(L, idx, &isnum);
    if (!isnum || !std::isfinite(v) || v < 0 || v > 1.8e19)
        luaL_error(L, "%s must be a non-negative number (got %s)", what, luaL_typename(L, idx));
    if (lua_isinteger(L, idx)) return static_cast<uint64_t>(lua_tointeger(L, idx));
    return static_cast<uint64_t>(std::llround(v));
}

uint32_t check_token(lua_State* L, int idx) {
    uint64_t t = check_u64(L, idx, "token");
    if (t > 0xffffffffu) luaL_error(L, "token out of range");
    return static_cast<uint32_t>(t);
}

// {rate = N, backup = bool}: unknown keys are errors.
SubflowSettings check_settings(lua_State* L, int idx, const char* what) {
    idx = lua_absindex(L, idx);
    luaL_checktype(L, idx, LUA_TTABLE);
    SubflowSettings s;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "%s: keys must be names, got a %s key", what, luaL_typename(L, -2));
        const char* k = lua_tostring(L, -2);
        if (std::strcmp(k, "rate") == 0) {
            s.rate = check_u64(L, -1, "rate");
        } else if (std::strcmp(k, "backup") == 0) {
            if (!lua_isboolean(L, -1)) luaL_error(L, "%s: backup must be a boolean", what);
            s.backup = lua_toboolean(L, -1);
        } else {
            luaL_error(L, "%s: unknown key '%s' (expected rate, backup)", what, k);
        }
        lua_pop(L, 1);
    }
    return s;
}

// Runs f (a backend call) and raises its exception's message as a Lua error.
template <typename F>
auto guarded(lua_State* L, F&& f) -> decltype(f()) {
    Impl* im = impl_of(L);
    bool failed = false;
    decltype(f()) r{};
    try {
        r = f();
    } catch (const std::exception& e) {
        std::snprintf(im->err, sizeof im->err, "%s", e.what());
        failed = true;
    }
    if (failed) luaL_error(L, "%s", im->err);  // r is trivially destructible at every use
    return r;
}

// ---- the mpsteer table ---------------------------------------------------------------------

int api_connections(lua_State* L) {
    Impl* im = impl_of(L);
    bool failed = false;
    try {
        im->conns = im->backend->connections();
    } catch (const std::exception& e) {
        std::snprintf(im->err, sizeof im->err, "%s", e.what());
        failed = true;
    }
    if (failed) return luaL_error(L, "%s", im->err);
    lua_createtable(L, static_cast<int>(im->conns.size()), 0);
    for (size_t i = 0; i < im->conns.size(); ++i) {
        push_conn(L, im->conns[i]);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

int api_connection(lua_State* L) {
    Impl* im = impl_of(L);
    uint32_t token = check_token(L, 1);
    bool failed = false;
    try {
        im->conn = im->backend->connection(token);
    } catch (const std::exception& e) {
        std::snprintf(im->err, sizeof im->err, "%s", e.what());
        failed = true;
    }
    if (failed) return luaL_error(L, "%s", im->err);
    if (!im->conn) return lua_pushnil(L), 1;
    push_conn(L, *im->conn);
    return 1;
}

int api_subflow(lua_State* L) {
    Impl* im = impl_of(L);
    uint64_t id = check_u64(L, 1, "subflow id");
    bool failed = false;
    try {
        im->sf = im->backend->subflow(id);
    } catch (const std::exception& e) {
        std::snprintf(im->err, sizeof im->err, "%s", e.what());
        failed = true;
    }
    if (failed) return luaL_error(L, "%s", im->err);
    if (!im->sf) return lua_pushnil(L), 1;
    push_subflow(L, *im->sf);
    return 1;
}

int apply_settings(lua_State* L, uint64_t id, const SubflowSettings& s) {
    Impl* im = impl_of(L);
    bool ok = guarded(L, [&] { return im->backend->set_subflow(im->owner->spec().policy, id, s); });
    if (ok) ++const_cast<ScriptStatus&>(im->owner->status()).writes;
    lua_pushboolean(L, ok);
    return 1;
}

int api_set_subflow(lua_State* L) {
    uint64_t id = check_u64(L, 1, "subflow id");
    SubflowSettings s = check_settings(L, 2, "set_subflow");
    return apply_settings(L, id, s);
}

int api_set_rate(lua_State* L) {
    SubflowSettings s;
    uint64_t id = check_u64(L, 1, "subflow id");
    s.rate = check_u64(L, 2, "rate");
    return apply_settings(L, id, s);
}

int api_set_backup(lua_State* L) {
    SubflowSettings s;
    uint64_t id = check_u64(L, 1, "subflow id");
    luaL_checktype(L, 2, LUA_TBOOLEAN);
    s.backup = lua_toboolean(L, 2);
    return apply_settings(L, id, s);
}

int addr_call(lua_State* L, bool add) {
    Impl* im = impl_of(L);
    uint32_t token = check_token(L, 1);
    uint64_t id = check_u64(L, 2, "address id");
    if (id > 255) return luaL_error(L, "address id out of range");
    bool ok = guarded(L, [&] {
        const auto& pol = im->owner->spec().policy;
        return add ? im->backend->add_subflow(pol, token, uint8_t(id))
                   : im->backend->block_address(pol, token, uint8_t(id));
    });
    if (ok) ++const_cast<ScriptStatus&>(im->owner->status()).writes;
    lua_pushboolean(L, ok);
    return 1;
}
int api_set_policy_backup(lua_State* L) {
    Impl* im = impl_of(L);
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    bool b = lua_toboolean(L, 1);
    int n = guarded(L, [&] { return im->backend->set_policy_backup(im->owner->spec().policy, b); });
    const_cast<ScriptStatus&>(im->owner->status()).writes += uint64_t(n);
    lua_pushinteger(L, n);
    return 1;
}
int api_add_subflow(lua_State* L) { return addr_call(L, true); }
int api_block_address(lua_State* L) { return addr_call(L, false); }

int api_log(lua_State* L) {
    Impl* im = impl_of(L);
    const char* level = luaL_checkstring(L, 1);
    const char* msg = luaL_checkstring(L, 2);
    spdlog::level::level_enum lv;
    if (!std::strcmp(level, "debug")) lv = spdlog::level::debug;
    else if (!std::strcmp(level, "info")) lv = spdlog::level::info;
    else if (!std::strcmp(level, "warn")) lv = spdlog::level::warn;
    else if (!std::strcmp(level, "error")) lv = spdlog::level::err;
    else return luaL_error(L, "log: unknown level '%s' (debug, info, warn, error)", level);
    spdlog::log(lv, "lua {}: {}", im->owner->spec().policy, msg);
    return 0;
}

int api_time(lua_State* L) {
    lua_pushnumber(L, std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
    return 1;
}

int api_rate(lua_State* L) {
    const char* s = luaL_checkstring(L, 1);
    auto r = manifest::parse_rate_bytes_per_sec(s);
    if (!r) return luaL_error(L, "rate: '%s' is not a rate like 20Mbit or 2MB/s", s);
    lua_pushinteger(L, static_cast<lua_Integer>(*r));
    return 1;
}

// Opens the allowed libraries and removes what the sandbox forbids. Runs protected.
int setup(lua_State* L) {
    Impl* im = impl_of(L);
    const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},     {LUA_STRLIBNAME, luaopen_string},
                             {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
                             {LUA_UTF8LIBNAME, luaopen_utf8}};
    for (const auto& l : libs) {
        luaL_requiref(L, l.name, l.func, 1);
        lua_pop(L, 1);
    }
    lua_pushglobaltable(L);
    for (const char* k : {"dofile", "loadfile", "collectgarbage", "require"}) {
        lua_pushnil(L);
        lua_setfield(L, -2, k);
    }
    lua_pushcfunction(L, sb_load);
    lua_setfield(L, -2, "load");
    lua_pushcfunction(L, sb_pcall);
    lua_setfield(L, -2, "pcall");
    lua_pushcfunction(L, sb_xpcall);
    lua_setfield(L, -2, "xpcall");
    lua_pushcfunction(L, sb_print);
    lua_setfield(L, -2, "print");
    lua_getfield(L, -1, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_getfield(L, -1, "rep");
    lua_pushcclosure(L, sb_rep, 1);
    lua_setfield(L, -2, "rep");
    lua_pop(L, 1);  // string

    const luaL_Reg api[] = {{"connections", api_connections}, {"connection", api_connection},
                            {"subflow", api_subflow},         {"set_subflow", api_set_subflow},
                            {"set_rate", api_set_rate},       {"set_backup", api_set_backup},
                            {"add_subflow", api_add_subflow}, {"block_address", api_block_address},
                            {"set_policy_backup", api_set_policy_backup},
                            {"log", api_log},                 {"time", api_time},
                            {"rate", api_rate},               {nullptr, nullptr}};
    luaL_newlib(L, api);
    set_str(L, "policy", im->owner->spec().policy);
    set_int(L, "every_ms", im->owner->spec().every_ms);
    lua_setfield(L, -2, "mpsteer");
    push_json(L, im->owner->spec().params);
    lua_setfield(L, -2, "params");
    lua_pop(L, 1);  // _G
    return 0;
}

// Runs the current call: the hook with its arguments, then checks what it returned.
int trampoline(lua_State* L) {
    Impl* im = impl_of(L);
    if (lua_getglobal(L, im->hook) != LUA_TFUNCTION) return 0;
    int n = im->push ? im->push(L) : 0;
    lua_call(L, n, 1);
    if (im->returns) {
        im->returns(L);
    } else if (!lua_isnil(L, -1)) {
        luaL_error(L, "%s must return nothing (got a %s)", im->hook, luaL_typename(L, -1));
    }
    return 0;
}

}  // namespace

// ---- Script --------------------------------------------------------------------------------

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
            {"max_call_us", max_call_us}};
}

namespace {
// Calls fn (a C function) protected, with the budget armed; records the outcome in status.
bool protected_run(Impl& im, ScriptStatus& st, lua_CFunction fn, const char* what) {
    lua_State* L = im.L;
    lua_settop(L, 0);
    im.oom = im.over_budget = im.headroom = false;
    im.budget_left = std::max<uint64_t>(1, im.limits.instructions / 1000);
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1000);
    lua_pushcfunction(L, traceback);
    lua_pushcfunction(L, fn);
    auto t0 = Clock::now();
    int rc = lua_pcall(L, 0, 0, 1);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    ++st.calls;
    st.last_call_us = us;
    st.max_call_us = std::max(st.max_call_us, us);
    bool ok = rc == LUA_OK;
    if (!ok) {
        std::string msg;
        if (const char* m = lua_tostring(L, -1)) msg = m;
        if (im.oom)
            msg = "memory cap exceeded (" + std::to_string(im.limits.memory_bytes) + " bytes)" +
                  (msg.empty() ? "" : ": " + msg);
        else if (im.over_budget && msg.find("instruction budget") == std::string::npos)
            msg = "instruction budget exceeded: " + msg;
        ++st.failures;
        ++st.consecutive_failures;
        st.last_error = std::string(what) + ": " + msg;
        spdlog::warn("lua {} ({}): {}", st.policy, st.script, st.last_error);
        if (st.consecutive_failures >= im.limits.max_failures && !st.disabled) {
            st.disabled = true;
            spdlog::error("lua {} ({}): disabled after {} failures in a row", st.policy,
                          st.script, st.consecutive_failures);
        }
    } else {
        st.consecutive_failures = 0;
    }
    lua_settop(L, 0);
    im.headroom = false;
    // No collection step here: that is collect_step's, between events (Lua's own incremental
    // collector still runs when a call allocates past its threshold).
    return ok;
}
}  // namespace

Script::Script(ScriptSpec spec, Backend& backend, Limits limits)
    : spec_(std::move(spec)), impl_(std::make_unique<Impl>()) {
    status_.policy = spec_.policy;
    status_.script = spec_.name;
    impl_->owner = this;
    impl_->backend = &backend;
    impl_->limits = limits;
    impl_->L = lua_newstate(capped_alloc, impl_.get());
    if (!impl_->L) {
        status_.disabled = true;
        status_.last_error = "load: cannot create a Lua state within the memory cap";
        return;
    }
    *static_cast<Impl**>(lua_getextraspace(impl_->L)) = impl_.get();
    if (!protected_run(*impl_, status_, setup, "setup")) {
        status_.disabled = true;
        return;
    }
    // Text only: a precompiled chunk is refused here, as by load().
    std::string chunkname = "@" + spec_.name;
    int rc = luaL_loadbufferx(impl_->L, spec_.source.data(), spec_.source.size(),
                              chunkname.c_str(), "t");
    if (rc != LUA_OK) {
        status_.last_error = std::string("load: ") + lua_tostring(impl_->L, -1);
        ++status_.failures;
        status_.disabled = true;
        lua_settop(impl_->L, 0);
        spdlog::error("lua {} ({}): {}; disabled", spec_.policy, spec_.name, status_.last_error);
        return;
    }
    lua_setglobal(impl_->L, "__mpsteer_chunk");
    impl_->hook = "__mpsteer_chunk";
    impl_->push = nullptr;
    impl_->returns = [](lua_State*) {};
    bool ok = protected_run(*impl_, status_, trampoline, "load");
    lua_pushnil(impl_->L);
    lua_setglobal(impl_->L, "__mpsteer_chunk");
    if (!ok) {
        status_.disabled = true;  // no hooks defined: nothing to retry
        return;
    }
    status_.loaded = true;
    status_.calls = 0;  // setup and the chunk are not hook calls
}

Script::~Script() = default;

bool Script::has(const char* hook) const {
    if (!impl_->L) return false;
    bool f = lua_getglobal(impl_->L, hook) == LUA_TFUNCTION;
    lua_pop(impl_->L, 1);
    return f;
}

bool Script::collect_step() {
    Impl& im = *impl_;
    if (!im.L) return false;
    const size_t enough = std::max<size_t>(32u << 10, im.gc_base / 4);
    if (!im.gc_cycle) {
        if (im.used < im.gc_base + enough) return false;
        im.gc_cycle = true;
        im.gc_cycles = 0;
    }
    // Finalizers (__gc) may run inside: give them a call's budget (their errors become
    // warnings inside lua_gc, which raises nothing).
    im.oom = im.over_budget = im.headroom = false;
    im.budget_left = std::max<uint64_t>(1, im.limits.instructions / 1000);
    if (lua_gc(im.L, LUA_GCSTEP, 0)) {
        // The cycle that ended may have begun inside a call (Lua's own steps) and kept what
        // was live then: still grown, so one more.
        if (++im.gc_cycles < 2 && im.used >= im.gc_base + enough) return true;
        im.gc_cycle = false;
        im.gc_base = im.used;
    }
    return im.gc_cycle;
}

size_t Script::memory_bytes() const { return impl_->used; }

void Script::schedule_from(Clock::time_point now) {
    next_tick_ = spec_.every_ms ? now + std::chrono::milliseconds(spec_.every_ms)
                                : Clock::time_point::max();
}

namespace {
// The value a hook about one subflow may return: nil, or settings for that subflow.
std::function<void(lua_State*)> settings_return(Impl* im, const char* hook, uint64_t id) {
    return [im, hook, id](lua_State* L) {
        if (lua_isnil(L, -1)) return;
        if (!lua_istable(L, -1))
            luaL_error(L, "%s must return nothing or a table {rate=, backup=} (got a %s)", hook,
                       luaL_typename(L, -1));
        SubflowSettings s = check_settings(L, -1, hook);
        if (id == 0) luaL_error(L, "%s returned settings but the subflow is unknown", hook);
        apply_settings(L, id, s);
    };
}
}  // namespace

bool Script::call(const char* hook, std::function<int(lua_State*)> push,
                  std::function<void(lua_State*)> returns) {
    if (status_.disabled) return false;
    if (!has(hook)) return true;
    impl_->hook = hook;
    impl_->push = std::move(push);
    impl_->returns = std::move(returns);
    bool ok = protected_run(*impl_, status_, trampoline, hook);
    impl_->push = nullptr;
    impl_->returns = nullptr;
    return ok;
}

bool Script::on_connection(const Connection& c) {
    uint64_t id = c.subflows.empty() ? 0 : c.subflows.front().id;
    return call("on_connection", [&c](lua_State* L) { push_conn(L, c); return 1; },
                settings_return(impl_.get(), "on_connection", id));
}
bool Script::on_subflow(const Subflow& s) {
    return call("on_subflow", [&s](lua_State* L) { push_subflow(L, s); return 1; },
                settings_return(impl_.get(), "on_subflow", s.id));
}
bool Script::on_subflow_closed(const Subflow& s) {
    return call("on_subflow_closed", [&s](lua_State* L) { push_subflow(L, s); return 1; }, nullptr);
}
bool Script::on_add_addr_blocked(const AddAddr& a) {
    return call("on_add_addr_blocked",
                [&a](lua_State* L) {
                    lua_createtable(L, 0, 5);
                    set_int(L, "token", a.token);
                    set_str(L, "address", a.address);
                    set_int(L, "port", a.port);
                    set_int(L, "addr_id", a.addr_id);
                    set_str(L, "subflow", a.subflow);
                    return 1;
                },
                nullptr);
}
bool Script::on_tick() {
    return call("on_tick",
                [this](lua_State* L) {
                    lua_pushinteger(L, spec_.every_ms);
                    return 1;
                },
                nullptr);
}
bool Script::on_apply(const nlohmann::json& info) {
    return call("on_apply", [&info](lua_State* L) { push_json(L, info); return 1; }, nullptr);
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
        auto s = std::make_unique<Script>(spec, backend_, limits_);
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
            s->on_apply({{"revision", revision}, {"generation", generation}, {"reloaded", reloaded}});
    }
    return loaded;
}

void HookSet::on_connection(const Connection& c) { each([&](Script& s) { s.on_connection(c); }); }
void HookSet::on_subflow(const Subflow& sf) { each([&](Script& s) { s.on_subflow(sf); }); }
void HookSet::on_subflow_closed(const Subflow& sf) {
    each([&](Script& s) { s.on_subflow_closed(sf); });
}
void HookSet::on_add_addr_blocked(const AddAddr& a) {
    each([&](Script& s) { s.on_add_addr_blocked(a); });
}

Clock::time_point HookSet::tick(Clock::time_point now) {
    auto next = Clock::time_point::max();
    for (auto& [name, s] : scripts_) {
        if (s->disabled() || !s->spec().every_ms) continue;
        if (s->next_tick() <= now) {
            s->on_tick();
            auto every = std::chrono::milliseconds(s->spec().every_ms);
            auto nt = s->next_tick() + every;
            if (nt <= now) nt = now + every;  // missed ticks are skipped, not queued
            if (s->disabled()) continue;
            // schedule_from would drift; keep the grid
            s->schedule_from(nt - every);
        }
        next = std::min(next, s->next_tick());
    }
    return next;
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

std::vector<ScriptStatus> HookSet::status() const {
    std::vector<ScriptStatus> out;
    for (const auto& [name, s] : scripts_) out.push_back(s->status());
    return out;
}

nlohmann::json HookSet::status_json() const {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& [name, s] : scripts_) a.push_back(s->status().to_json());
    return a;
}

Script* HookSet::find(const std::string& policy) {
    auto it = scripts_.find(policy);
    return it == scripts_.end() ? nullptr : it->second.get();
}

ScriptSpec read_spec(const std::string& policy, const std::string& script_as_written,
                     const std::string& path, uint32_t every_ms, const nlohmann::json& params) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read Lua script " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    ScriptSpec s;
    s.policy = policy;
    s.name = script_as_written;
    s.source = ss.str();
    s.every_ms = every_ms;
    s.params = params;
    return s;
}

}  // namespace mpsteer::lua
