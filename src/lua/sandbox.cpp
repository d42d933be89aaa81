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
    if (L) {
        budget_left = 1;  // finalizers run at close: keep them bounded
        over_budget = true;
        lua_close(L);
    }
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

void count_hook(lua_State* L, lua_Debug*) {
    Script::Impl* im = impl_of(L);
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
    Script::Impl* im = impl_of(L);
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
    Script::Impl* im = impl_of(L);
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

int sb_print(lua_State* L) {
    Script::Impl* im = impl_of(L);
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

}  // namespace

lua_State* new_sandboxed_state(Script::Impl& im) {
    lua_State* L = lua_newstate(capped_alloc, &im);
    if (L) *static_cast<Script::Impl**>(lua_getextraspace(L)) = &im;
    return L;
}

void open_sandboxed_libraries(lua_State* L) {
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
    lua_pop(L, 2);  // string, _G
}

std::optional<std::string> run_protected(Script::Impl& im, lua_CFunction fn) {
    lua_State* L = im.L;
    lua_settop(L, 0);
    im.oom = im.over_budget = im.headroom = false;
    im.budget_left = std::max<uint64_t>(1, im.limits.instructions / 1000);
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1000);
    lua_pushcfunction(L, traceback);
    lua_pushcfunction(L, fn);
    std::optional<std::string> error;
    if (lua_pcall(L, 0, 0, 1) != LUA_OK) {
        std::string msg;
        if (const char* m = lua_tostring(L, -1)) msg = m;
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

int run_current_hook(lua_State* L) {
    Script::Impl* im = impl_of(L);
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

bool collect_garbage_step(Script::Impl& im) {
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

}  // namespace mpsteer::lua
