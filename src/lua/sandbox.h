// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The sandboxed Lua state of one script (internal to mpsteer_lua): the state and its limits,
// the restricted libraries, protected calls with an instruction budget and a memory cap, and
// garbage collection between events. What a script may call on the agent is script_api.h's;
// loading a script, counting its failures and disabling it are Script's (hooks.cpp).
//
// Lua is C and raises errors with longjmp: every function that can raise a Lua error holds no
// C++ object with a destructor at the moment it raises (messages go through fixed buffers,
// temporaries live in Impl), and everything that allocates inside the state runs under a
// protected call, so the memory cap can never reach lua_atpanic. No panic handler is set: Debian's
// Lua is built as C, so a handler could only abort or longjmp; instead nothing outside
// run_protected touches the state except calls that cannot raise (lua_rawgeti on the registry,
// lua_settop, lua_gc, lua_close; the hooks are registry references, never looked up by name).
#pragma once

#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>

#include <atomic>
#include <chrono>
#include <string_view>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "lua/hooks.h"

namespace mpsteer::lua {

struct Script::Impl {
    lua_State* L = nullptr;
    Script* owner = nullptr;
    Backend* backend = nullptr;
    Limits limits;
    size_t used = 0;
    bool headroom = false;     // the error handler may exceed the cap a little
    bool oom = false;          // the cap refused an allocation during this call
    bool over_budget = false;  // the instruction budget or the call's time ran out
    uint64_t budget_left = 0;  // in units of 1000 instructions
    std::chrono::steady_clock::time_point deadline;  // of the call in progress
    uint32_t api_calls = 0;                          // mpsteer.* calls during this call
    // Logging's rate limit: lines in the current second, and the ones dropped.
    std::chrono::steady_clock::time_point log_second;
    uint32_t log_lines = 0, log_dropped = 0;
    // The hooks the chunk defined, as registry references (LUA_NOREF: none).
    int hook_refs[7] = {LUA_NOREF, LUA_NOREF, LUA_NOREF, LUA_NOREF,
                        LUA_NOREF, LUA_NOREF, LUA_NOREF};
    std::string chunkname;  // "@lua/ecf.lua"
    // The call in progress (read by run_current_hook).
    const char* hook = nullptr;
    int hook_ref = LUA_NOREF;
    std::function<int(lua_State*)> push;      // pushes the arguments, returns how many
    std::function<void(lua_State*)> returns;  // checks/uses the value on top (may raise)
    // Temporaries the API functions fill before pushing (never locals: see the top).
    std::vector<Connection> conns;
    std::optional<Connection> conn;
    std::optional<Subflow> sf;
    char err[512] = {};
    size_t gc_base = 0;     // bytes in use after the last full cycle collect_step finished
    bool gc_cycle = false;  // collect_step is in a cycle
    int gc_cycles = 0;      // cycles it finished since it began

    ~Impl();
};

// The Impl a state belongs to (kept in the state's extra space).
inline Script::Impl* impl_of(lua_State* L) {
    return *static_cast<Script::Impl**>(lua_getextraspace(L));
}

// The hooks a chunk may define, in hook_refs' order; -1: not a hook.
inline constexpr const char* kHookNames[7] = {
    "on_connection", "on_subflow", "on_subflow_closed", "on_add_addr_blocked", "on_tick",
    "on_apply",      "on_link"};
static_assert(std::size(kHookNames) == sizeof(Script::Impl::hook_refs) / sizeof(int));
int hook_index(const char* name);

// Text leaving a script (errors, log lines, print) as valid UTF-8 (invalid bytes become
// U+FFFD) of at most max bytes (longer: cut, with a note).
std::string sanitize_text(std::string_view s, size_t max);

// Logs a script's line (mpsteer.log, print) under the rate limit; raises nothing.
void log_line(Script::Impl& im, int level, std::string_view text);

// Charges n units of work done inside a C function (1 unit = 1000 instructions) to the budget;
// raises the budget error when it runs out. Also counts an API call when api is true.
void charge(lua_State* L, uint64_t units, bool api);

// A new state allocating through im's memory cap, linked to im; nullptr when even that fails.
lua_State* new_sandboxed_state(Script::Impl& im);

// Opens the allowed libraries and removes or replaces what the sandbox forbids. Raises Lua
// errors: call it inside run_protected.
void open_sandboxed_libraries(lua_State* L);

// Calls fn protected, with the budget armed and a traceback handler. Returns the error on
// failure: the message with its traceback, prefixed when the memory cap or the budget ran out.
std::optional<std::string> run_protected(Script::Impl& im, lua_CFunction fn);

// Loads im.owner's source as text and runs it, then takes the hooks it defined as references.
int load_chunk(lua_State* L);

// The function run_protected runs for a hook: im.hook_ref with im.push's arguments, then checks
// what it returned with im.returns (nil required when there is none).
int run_current_hook(lua_State* L);

// One garbage-collection step when the state has grown since its last full cycle; true while
// the cycle it started is not finished.
bool collect_garbage_step(Script::Impl& im);

}  // namespace mpsteer::lua
