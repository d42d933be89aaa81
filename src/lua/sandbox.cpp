// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The sandboxed Lua state (see sandbox.h): the capped allocator, the instruction budget, the
// restricted libraries with their sandbox-safe replacements, protected calls and garbage
// collection between events.
#include "lua/sandbox.h"

#include <lua5.4/lauxlib.h>
#include <lua5.4/lualib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace mpsteer::lua {
using Clock = std::chrono::steady_clock;

Script::Impl::~Impl() {
    if (L) lua_close(L);  // no finalizers to run: setmetatable refuses __gc
}

namespace {
void* capped_alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
    auto* im = static_cast<Script::Impl*>(ud);
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

[[noreturn]] void raise_over_budget(lua_State* L, Script::Impl* im, bool timed_out) {
    if (!im->over_budget) {
        im->over_budget = true;
        im->budget_left = 50;  // room for the error handler's traceback
    }
    if (timed_out)
        luaL_error(L, "time limit exceeded (%I ms per call)",
                   static_cast<lua_Integer>(im->limits.call_time.count()));
    luaL_error(L, "instruction budget exceeded (%I instructions)",
               static_cast<lua_Integer>(im->limits.instructions));
    std::abort();  // luaL_error does not return
}

// Every 1000 instructions: the budget and the call's wall-clock deadline. Set on the main
// thread only: the sandbox has no coroutines.
void count_hook(lua_State* L, lua_Debug*) {
    Script::Impl* im = impl_of(L);
    if (Clock::now() > im->deadline) raise_over_budget(L, im, true);
    if (im->budget_left > 0 && --im->budget_left > 0) return;
    raise_over_budget(L, im, false);
}

// Message handler: the error with a traceback.
int traceback(lua_State* L) {
    Script::Impl* im = impl_of(L);
    im->headroom = true;
    size_t len = 0;
    const char* msg = lua_tolstring(L, 1, &len);  // no __tostring: it would run script code
    if (!msg)
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    else if (len > im->limits.message_bytes)  // cut before the traceback is appended
        msg = lua_pushlstring(L, msg, im->limits.message_bytes);
    luaL_traceback(L, L, msg, 1);
    return 1;
}

// pcall/xpcall that cannot swallow the budget or the memory cap.
int sb_pcall(lua_State* L) {
    luaL_checkany(L, 1);
    int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    Script::Impl* im = impl_of(L);
    if (st != LUA_OK && (im->over_budget || im->oom)) return lua_error(L);
    lua_pushboolean(L, st == LUA_OK);
    lua_insert(L, 1);
    return lua_gettop(L);
}

// xpcall's message handler, wrapping the script's: when the budget or the memory cap stopped
// the call, the script's handler is skipped. Lua runs a message handler for an error raised in
// the count hook with hooks off, so the script's handler would run without a budget.
int guarded_msgh(lua_State* L) {
    Script::Impl* im = impl_of(L);
    if (im->over_budget || im->oom) {
        lua_settop(L, 1);
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

int sb_xpcall(lua_State* L) {
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 1);  // f
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, guarded_msgh, 1);  // msgh
    lua_replace(L, 1);                     // 1 = msgh
    lua_replace(L, 2);                     // 2 = f
    int st = lua_pcall(L, n - 2, LUA_MULTRET, 1);
    Script::Impl* im = impl_of(L);
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
    Script::Impl* im = impl_of(L);
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

// setmetatable without __gc: Lua runs finalizers with hooks off, outside any budget.
int sb_setmetatable(lua_State* L) {
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: __gc finalizers are not allowed");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

// string.find/match/gmatch/gsub: Lua's matcher backtracks inside C, where the count hook never
// runs. The worst case of a pattern with k repetition items (*, +, -, ?, %b) on n bytes is about
// m * n^(k+1) steps (n^k when anchored with ^, m the pattern's length); that estimate is charged
// to the budget at 10 000 steps per 1000 instructions, and a call it would exhaust is refused.
// A plain find (no special characters, or plain = true) costs m * n.
int sb_pattern(lua_State* L) {
    size_t n = 0, m = 0;
    luaL_checklstring(L, 1, &n);
    const char* p = luaL_checklstring(L, 2, &m);
    const char* name = lua_tostring(L, lua_upvalueindex(2));
    bool plain = lua_toboolean(L, lua_upvalueindex(3)) && lua_toboolean(L, 4);
    bool anchored = m > 0 && p[0] == '^';
    int k = 0;
    bool special = false;
    for (size_t i = 0; i < m; ++i) {
        char c = p[i];
        if (c == '%' && i + 1 < m) {
            if (p[i + 1] == 'b') ++k;
            special = true;
            ++i;
        } else if (c == '*' || c == '+' || c == '-' || c == '?') {
            ++k;
            special = true;
        } else if (std::strchr("^$.[]()", c)) {
            special = true;
        }
    }
    double cost = double(std::max<size_t>(m, 1)) * double(std::max<size_t>(n, 1));
    if (!plain && special) {
        int e = anchored ? k - 1 : k;
        for (int i = 0; i < e && cost < 1e30; ++i) cost *= double(std::max<size_t>(n, 1));
    }
    Script::Impl* im = impl_of(L);
    double units = cost / 10'000.0;
    if (units >= double(im->budget_left))
        return luaL_error(L,
                          "string.%s: pattern too costly for a %I-byte subject (%d repetition "
                          "items; see the sandbox's pattern limit)",
                          name, static_cast<lua_Integer>(n), k);
    charge(L, uint64_t(units), false);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

// tostring without addresses: Lua writes "table: 0x55d0..." for tables, functions, threads
// and userdata, the layout of the hook process's heap; scripts get the type name instead (a
// __tostring metamethod still speaks for its value).
const char* tostring_no_address(lua_State* L, int idx) {
    idx = lua_absindex(L, idx);
    switch (lua_type(L, idx)) {
    case LUA_TTABLE:
    case LUA_TFUNCTION:
    case LUA_TTHREAD:
    case LUA_TUSERDATA:
    case LUA_TLIGHTUSERDATA:
        if (luaL_getmetafield(L, idx, "__tostring") != LUA_TNIL) {
            lua_pop(L, 1);
            break;
        }
        return lua_pushstring(L, luaL_typename(L, idx));
    default: break;
    }
    return luaL_tolstring(L, idx, nullptr);
}

int sb_tostring(lua_State* L) {
    luaL_checkany(L, 1);
    tostring_no_address(L, 1);
    return 1;
}

int sb_print(lua_State* L) {
    Script::Impl* im = impl_of(L);
    const int n = lua_gettop(L);  // before the buffer, which may take a stack slot of its own
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; ++i) {
        tostring_no_address(L, i);
        luaL_addvalue(&b);
        if (i < n) luaL_addchar(&b, '\t');
        if (luaL_bufflen(&b) > im->limits.message_bytes) break;  // cut by log_line anyway
    }
    luaL_pushresult(&b);
    size_t len = 0;
    const char* s = lua_tolstring(L, -1, &len);
    log_line(*im, spdlog::level::info, std::string_view(s, len));
    return 0;
}

}  // namespace

lua_State* new_sandboxed_state(Script::Impl& im) {
    lua_State* L = lua_newstate(capped_alloc, &im);
    if (L) *static_cast<Script::Impl**>(lua_getextraspace(L)) = &im;
    return L;
}

void open_sandboxed_libraries(lua_State* L) {
    const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                             {LUA_STRLIBNAME, luaopen_string},
                             {LUA_TABLIBNAME, luaopen_table},
                             {LUA_MATHLIBNAME, luaopen_math},
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
    lua_pushcfunction(L, sb_tostring);
    lua_setfield(L, -2, "tostring");
    lua_getfield(L, -1, "setmetatable");
    lua_pushcclosure(L, sb_setmetatable, 1);
    lua_setfield(L, -2, "setmetatable");
    lua_getfield(L, -1, "string");
    for (const char* f : {"find", "match", "gmatch", "gsub"}) {
        lua_getfield(L, -1, f);
        lua_pushstring(L, f);
        lua_pushboolean(L, std::strcmp(f, "find") == 0);  // only find has `plain`
        lua_pushcclosure(L, sb_pattern, 3);
        lua_setfield(L, -2, f);
    }
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_getfield(L, -1, "rep");
    lua_pushcclosure(L, sb_rep, 1);
    lua_setfield(L, -2, "rep");
    lua_pop(L, 2);  // string, _G
}

int hook_index(const char* name) {
    for (int i = 0; i < int(std::size(kHookNames)); ++i)
        if (std::strcmp(kHookNames[i], name) == 0) return i;
    return -1;
}

std::string sanitize_text(std::string_view s, size_t max) {
    static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    std::string out;
    out.reserve(std::min(s.size(), max));
    size_t i = 0;
    while (i < s.size() && out.size() < max) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        size_t len = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
        bool ok = len > 0 && i + len <= s.size();
        for (size_t j = 1; ok && j < len; ++j)
            ok = (static_cast<unsigned char>(s[i + j]) >> 6) == 0x2;
        if (ok && len > 1) {  // overlong forms, surrogates and beyond U+10FFFF
            uint32_t cp = c & (0xFF >> (len + 1));
            for (size_t j = 1; j < len; ++j)
                cp = (cp << 6) | (static_cast<unsigned char>(s[i + j]) & 0x3F);
            static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok && c == 0) ok = false;  // NUL: kept out of logs and status
        if (ok) {
            out.append(s.substr(i, len));
            i += len;
        } else {
            out.append(kReplacement);
            ++i;
        }
    }
    if (i < s.size()) out += " ... (" + std::to_string(s.size() - i) + " more bytes cut)";
    return out;
}

void log_line(Script::Impl& im, int level, std::string_view text) {
    auto now = Clock::now();
    const auto& st = im.owner->status();
    if (now - im.log_second >= std::chrono::seconds(1)) {
        if (im.log_dropped)
            spdlog::warn("lua {}: {} log lines dropped (limit {} per second)", st.policy,
                         im.log_dropped, im.limits.log_lines_per_s);
        im.log_second = now;
        im.log_lines = im.log_dropped = 0;
    }
    if (im.log_lines >= im.limits.log_lines_per_s) {
        ++im.log_dropped;
        return;
    }
    ++im.log_lines;
    spdlog::log(static_cast<spdlog::level::level_enum>(level), "lua {}: {}", st.policy,
                sanitize_text(text, im.limits.message_bytes));
}

void charge(lua_State* L, uint64_t units, bool api) {
    Script::Impl* im = impl_of(L);
    if (api && ++im->api_calls > im->limits.api_calls)
        luaL_error(L, "too many mpsteer calls in one hook call (limit %I)",
                   static_cast<lua_Integer>(im->limits.api_calls));
    if (Clock::now() > im->deadline) raise_over_budget(L, im, true);
    if (units >= im->budget_left) raise_over_budget(L, im, false);
    im->budget_left -= units;
}

std::optional<std::string> run_protected(Script::Impl& im, lua_CFunction fn) {
    lua_State* L = im.L;
    lua_settop(L, 0);
    im.oom = im.over_budget = im.headroom = false;
    im.api_calls = 0;
    im.deadline = Clock::now() + im.limits.call_time;
    im.budget_left = std::max<uint64_t>(1, im.limits.instructions / 1000);
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1000);
    lua_pushcfunction(L, traceback);
    lua_pushcfunction(L, fn);
    std::optional<std::string> error;
    if (lua_pcall(L, 0, 0, 1) != LUA_OK) {
        std::string msg;
        size_t len = 0;
        if (const char* m = lua_tolstring(L, -1, &len))
            msg = sanitize_text(std::string_view(m, len), im.limits.message_bytes);
        if (im.oom)
            msg = "memory cap exceeded (" + std::to_string(im.limits.memory_bytes) + " bytes)" +
                  (msg.empty() ? "" : ": " + msg);
        else if (im.over_budget && msg.find("instruction budget") == std::string::npos)
            msg = "instruction budget exceeded: " + msg;
        error = std::move(msg);
    }
    lua_settop(L, 0);
    im.headroom = false;
    // No collection step here: that is collect_garbage_step's, between events (Lua's own
    // incremental collector still runs when a call allocates past its threshold).
    return error;
}

int load_chunk(lua_State* L) {
    Script::Impl* im = impl_of(L);
    const std::string& src = im->owner->spec().source;
    // Text only: a precompiled chunk is refused here, as by load().
    if (luaL_loadbufferx(L, src.data(), src.size(), im->chunkname.c_str(), "t") != LUA_OK)
        return lua_error(L);
    lua_call(L, 0, 0);
    // The hooks, read raw (a metatable on _G runs no code here) and kept as references.
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
    for (int i = 0; i < int(std::size(kHookNames)); ++i) {
        lua_pushstring(L, kHookNames[i]);
        if (lua_rawget(L, -2) == LUA_TFUNCTION)
            im->hook_refs[i] = luaL_ref(L, LUA_REGISTRYINDEX);
        else
            lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return 0;
}

int run_current_hook(lua_State* L) {
    Script::Impl* im = impl_of(L);
    if (lua_rawgeti(L, LUA_REGISTRYINDEX, im->hook_ref) != LUA_TFUNCTION) return 0;
    int n = im->push ? im->push(L) : 0;
    lua_call(L, n, 1);
    if (im->returns) {
        im->returns(L);
    } else if (!lua_isnil(L, -1)) {
        luaL_error(L, "%s must return nothing (got a %s)", im->hook, luaL_typename(L, -1));
    }
    return 0;
}

bool collect_garbage_step(Script::Impl& im) {
    if (!im.L) return false;
    const size_t enough = std::max<size_t>(32u << 10, im.gc_base / 4);
    if (!im.gc_cycle) {
        if (im.used < im.gc_base + enough) return false;
        im.gc_cycle = true;
        im.gc_cycles = 0;
    }
    // No finalizers can run inside (setmetatable refuses __gc); the budget is armed anyway.
    im.oom = im.over_budget = im.headroom = false;
    im.budget_left = std::max<uint64_t>(1, im.limits.instructions / 1000);
    im.deadline = Clock::now() + im.limits.call_time;
    if (lua_gc(im.L, LUA_GCSTEP, 0)) {
        // The cycle that ended may have begun inside a call (Lua's own steps) and kept what
        // was live then: still grown, so one more.
        if (++im.gc_cycles < 2 && im.used >= im.gc_base + enough) return true;
        im.gc_cycle = false;
        im.gc_base = im.used;
    }
    return im.gc_cycle;
}

}  // namespace mpsteer::lua
