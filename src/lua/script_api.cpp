// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The script API (see script_api.h): the `mpsteer` functions, each checking its arguments,
// calling the Backend and pushing the result, and the conversions they and the hooks share.
#include "lua/script_api.h"

#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>

#include "lua/sandbox.h"
#include "manifest/manifest.h"
#include "net/text.h"

namespace mpsteer::lua {
namespace {
using Clock = std::chrono::steady_clock;
using Impl = Script::Impl;

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

void push_json_at(lua_State* L, const nlohmann::json& j, int depth) {
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
            push_json_at(L, v, depth + 1);
            lua_rawseti(L, -2, i++);
        }
        break;
    }
    case nlohmann::json::value_t::object:
        lua_createtable(L, 0, static_cast<int>(j.size()));
        for (const auto& [k, v] : j.items()) {
            push_json_at(L, v, depth + 1);
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

// Runs f (a Backend call storing its result in Impl or in a trivially destructible local) and
// raises its exception's message as a Lua error, once the exception is gone.
template <typename F>
void guarded(lua_State* L, F&& f) {
    Impl* im = impl_of(L);
    bool failed = false;
    try {
        f();
    } catch (const std::exception& e) {
        std::snprintf(im->err, sizeof im->err, "%s", e.what());
        failed = true;
    }
    if (failed) luaL_error(L, "%s", im->err);
}

void count_writes(lua_State* L, uint64_t n) {
    const_cast<ScriptStatus&>(impl_of(L)->owner->status()).writes += n;
}

}  // namespace

void push_subflow(lua_State* L, const Subflow& s) {
    lua_createtable(L, 0, 24);
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
    set_str(L, "local_address", s.local_address);
    set_int(L, "bytes_received", s.bytes_received);
    set_int(L, "last_recv_ms", s.last_recv_ms);
    set_int(L, "last_ack_ms", s.last_ack_ms);
}

void push_connection(lua_State* L, const Connection& c) {
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

void push_add_addr(lua_State* L, const AddAddr& a) {
    lua_createtable(L, 0, 5);
    set_int(L, "token", a.token);
    set_str(L, "address", a.address);
    set_int(L, "port", a.port);
    set_int(L, "addr_id", a.addr_id);
    set_str(L, "subflow", a.subflow);
}

void push_link(lua_State* L, const Link& l) {
    lua_createtable(L, 0, 2);
    set_str(L, "interface", l.interface);
    set_bool(L, "up", l.up);
}

void push_json(lua_State* L, const nlohmann::json& j) {
    push_json_at(L, j, 0);
}

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

void apply_returned_settings(lua_State* L, uint64_t id, const SubflowSettings& s) {
    Impl* im = impl_of(L);
    guarded(L, [&] { im->backend->set_subflow_returned(im->owner->spec().policy, id, s); });
    count_writes(L, 1);
}

int apply_settings(lua_State* L, uint64_t id, const SubflowSettings& s) {
    Impl* im = impl_of(L);
    bool ok = false;
    guarded(L, [&] { ok = im->backend->set_subflow(im->owner->spec().policy, id, s); });
    if (ok) count_writes(L, 1);
    lua_pushboolean(L, ok);
    return 1;
}

namespace {

// ---- the mpsteer table ---------------------------------------------------------------------

int api_connections(lua_State* L) {
    Impl* im = impl_of(L);
    charge(L, 0, true);
    guarded(L, [im] { im->conns = im->backend->connections(); });
    charge(L, im->conns.size(), false);  // building the tables is work the hook does not count
    lua_createtable(L, static_cast<int>(im->conns.size()), 0);
    for (size_t i = 0; i < im->conns.size(); ++i) {
        push_connection(L, im->conns[i]);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

int api_connection(lua_State* L) {
    charge(L, 0, true);
    Impl* im = impl_of(L);
    uint32_t token = check_token(L, 1);
    guarded(L, [im, token] { im->conn = im->backend->connection(token); });
    if (!im->conn) return lua_pushnil(L), 1;
    push_connection(L, *im->conn);
    return 1;
}

int api_subflow(lua_State* L) {
    charge(L, 0, true);
    Impl* im = impl_of(L);
    uint64_t id = check_u64(L, 1, "subflow id");
    guarded(L, [im, id] { im->sf = im->backend->subflow(id); });
    if (!im->sf) return lua_pushnil(L), 1;
    push_subflow(L, *im->sf);
    return 1;
}

int api_set_subflow(lua_State* L) {
    charge(L, 0, true);
    uint64_t id = check_u64(L, 1, "subflow id");
    SubflowSettings s = check_settings(L, 2, "set_subflow");
    return apply_settings(L, id, s);
}

int api_set_rate(lua_State* L) {
    charge(L, 0, true);
    SubflowSettings s;
    uint64_t id = check_u64(L, 1, "subflow id");
    s.rate = check_u64(L, 2, "rate");
    return apply_settings(L, id, s);
}

int api_set_backup(lua_State* L) {
    charge(L, 0, true);
    SubflowSettings s;
    uint64_t id = check_u64(L, 1, "subflow id");
    luaL_checktype(L, 2, LUA_TBOOLEAN);
    s.backup = lua_toboolean(L, 2);
    return apply_settings(L, id, s);
}

// add_subflow / block_address (token, address id): re-inject or hide an announcement.
int address_call(lua_State* L, bool add) {
    charge(L, 0, true);
    Impl* im = impl_of(L);
    uint32_t token = check_token(L, 1);
    uint64_t id = check_u64(L, 2, "address id");
    if (id > 255) return luaL_error(L, "address id out of range");
    bool ok = false;
    guarded(L, [&] {
        const auto& pol = im->owner->spec().policy;
        ok = add ? im->backend->add_subflow(pol, token, uint8_t(id))
                 : im->backend->block_address(pol, token, uint8_t(id));
    });
    if (ok) count_writes(L, 1);
    lua_pushboolean(L, ok);
    return 1;
}
int api_add_subflow(lua_State* L) {
    return address_call(L, true);
}
int api_block_address(lua_State* L) {
    return address_call(L, false);
}

int api_set_policy_backup(lua_State* L) {
    charge(L, 0, true);
    Impl* im = impl_of(L);
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    bool b = lua_toboolean(L, 1);
    int n = 0;
    guarded(L, [&] { n = im->backend->set_policy_backup(im->owner->spec().policy, b); });
    count_writes(L, uint64_t(n));
    lua_pushinteger(L, n);
    return 1;
}

int api_endpoints(lua_State* L) {
    Impl* im = impl_of(L);
    charge(L, 0, true);
    std::vector<Endpoint> eps;
    guarded(L, [&] { eps = im->backend->endpoints(); });
    charge(L, eps.size(), false);
    lua_createtable(L, static_cast<int>(eps.size()), 0);
    for (size_t i = 0; i < eps.size(); ++i) {
        lua_createtable(L, 0, 6);
        set_int(L, "id", eps[i].id);
        set_str(L, "address", eps[i].address);
        set_str(L, "interface", eps[i].interface);
        set_bool(L, "subflow", eps[i].subflow);
        set_bool(L, "signal", eps[i].signal);
        set_bool(L, "backup", eps[i].backup);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

int api_renew_endpoint(lua_State* L) {
    charge(L, 0, true);
    Impl* im = impl_of(L);
    size_t len = 0;
    const char* a = luaL_checklstring(L, 1, &len);
    if (len > 64) return luaL_error(L, "renew_endpoint: '%s' is not an address", "(too long)");
    const std::string address(a, len);
    bool ok = false;
    guarded(L, [&] { ok = im->backend->renew_endpoint(im->owner->spec().policy, address); });
    if (ok) count_writes(L, 1);
    lua_pushboolean(L, ok);
    return 1;
}

// set_status(t): a flat table of names to strings, numbers and booleans shown in the status
// under the script's entry (replacing what it set before). Text is escaped and cut. The error
// is raised only once the C++ objects are gone (a Lua error unwinds without destructors).
int api_set_status(lua_State* L) {
    charge(L, 0, true);
    luaL_checktype(L, 1, LUA_TTABLE);
    char err[160] = {};
    {
        nlohmann::json out = nlohmann::json::object();
        lua_pushnil(L);
        while (lua_next(L, 1)) {
            size_t klen = 0;
            const char* k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : nullptr;
            const int vt = lua_type(L, -1);
            if (!k)
                std::snprintf(err, sizeof err, "set_status: keys must be names, got a %s key",
                              luaL_typename(L, -2));
            else if (out.size() == ScriptStatus::kStatusEntries)
                std::snprintf(err, sizeof err, "set_status: more than %zu entries",
                              ScriptStatus::kStatusEntries);
            else if (klen > ScriptStatus::kStatusKeyBytes)
                std::snprintf(err, sizeof err, "set_status: a name longer than %zu bytes",
                              ScriptStatus::kStatusKeyBytes);
            else if (vt != LUA_TBOOLEAN && vt != LUA_TNUMBER && vt != LUA_TSTRING)
                std::snprintf(err, sizeof err,
                              "set_status: values must be strings, numbers or booleans (got %s)",
                              luaL_typename(L, -1));
            if (err[0]) {
                lua_pop(L, 2);
                break;
            }
            const std::string key = net::escape_control(std::string_view(k, klen));
            if (vt == LUA_TBOOLEAN) {
                out[key] = bool(lua_toboolean(L, -1));
            } else if (vt == LUA_TNUMBER) {
                if (lua_isinteger(L, -1))
                    out[key] = int64_t(lua_tointeger(L, -1));
                else
                    out[key] = lua_tonumber(L, -1);
            } else {
                size_t vlen = 0;
                const char* v = lua_tolstring(L, -1, &vlen);
                out[key] = net::escape_control(
                    sanitize_text(std::string_view(v, vlen), ScriptStatus::kStatusValueBytes));
            }
            lua_pop(L, 1);
        }
        if (!err[0])
            const_cast<ScriptStatus&>(impl_of(L)->owner->status()).published = std::move(out);
    }
    if (err[0]) return luaL_error(L, "%s", err);
    return 0;
}

int api_log(lua_State* L) {
    charge(L, 0, true);
    Impl* im = impl_of(L);
    const char* level = luaL_checkstring(L, 1);
    size_t len = 0;
    const char* msg = luaL_checklstring(L, 2, &len);
    spdlog::level::level_enum lv;
    if (!std::strcmp(level, "debug"))
        lv = spdlog::level::debug;
    else if (!std::strcmp(level, "info"))
        lv = spdlog::level::info;
    else if (!std::strcmp(level, "warn"))
        lv = spdlog::level::warn;
    else if (!std::strcmp(level, "error"))
        lv = spdlog::level::err;
    else
        return luaL_error(L, "log: unknown level '%s' (debug, info, warn, error)", level);
    log_line(*im, lv, std::string_view(msg, len));
    return 0;
}

int api_time(lua_State* L) {
    charge(L, 0, true);
    lua_pushnumber(L, std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
    return 1;
}

int api_rate(lua_State* L) {
    charge(L, 0, true);
    const char* s = luaL_checkstring(L, 1);
    auto r = manifest::parse_rate_bytes_per_sec(s);
    if (!r) return luaL_error(L, "rate: '%s' is not a rate like 20Mbit or 2MB/s", s);
    lua_pushinteger(L, static_cast<lua_Integer>(*r));
    return 1;
}

}  // namespace

void open_script_api(lua_State* L) {
    Impl* im = impl_of(L);
    const luaL_Reg api[] = {{"connections", api_connections},
                            {"connection", api_connection},
                            {"subflow", api_subflow},
                            {"set_subflow", api_set_subflow},
                            {"set_rate", api_set_rate},
                            {"set_backup", api_set_backup},
                            {"add_subflow", api_add_subflow},
                            {"block_address", api_block_address},
                            {"set_policy_backup", api_set_policy_backup},
                            {"endpoints", api_endpoints},
                            {"renew_endpoint", api_renew_endpoint},
                            {"set_status", api_set_status},
                            {"log", api_log},
                            {"time", api_time},
                            {"rate", api_rate},
                            {nullptr, nullptr}};
    lua_pushglobaltable(L);
    luaL_newlib(L, api);
    set_str(L, "policy", im->owner->spec().policy);
    set_int(L, "every_ms", im->owner->spec().every_ms);
    lua_setfield(L, -2, "mpsteer");
    push_json(L, im->owner->spec().params);
    lua_setfield(L, -2, "params");
    lua_pop(L, 1);  // _G
}

}  // namespace mpsteer::lua
