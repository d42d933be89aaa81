// The sandboxed Lua state of one script (internal to mpsteer_lua): the state and its limits,
// the restricted libraries, protected calls with an instruction budget and a memory cap, and
// garbage collection between events. What a script may call on the agent is script_api.h's;
// loading a script, counting its failures and disabling it are Script's (hooks.cpp).
//
// Lua is C and raises errors with longjmp: every function that can raise a Lua error holds no
// C++ object with a destructor at the moment it raises (messages go through fixed buffers,
// temporaries live in Impl), and everything that allocates inside the state runs under a
// protected call, so the memory cap can never reach lua_atpanic.
#pragma once

#include <lua5.4/lua.h>

#include <cstddef>
#include <cstdint>
#include <functional>
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
    bool over_budget = false;  // the instruction budget ran out during this call
    uint64_t budget_left = 0;  // in units of 1000 instructions
    // The call in progress (read by run_current_hook).
    const char* hook = nullptr;
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

// A new state allocating through im's memory cap, linked to im; nullptr when even that fails.
lua_State* new_sandboxed_state(Script::Impl& im);

// Opens the allowed libraries and removes or replaces what the sandbox forbids. Raises Lua
// errors: call it inside run_protected.
void open_sandboxed_libraries(lua_State* L);

// Calls fn protected, with the budget armed and a traceback handler. Returns the error on
// failure: the message with its traceback, prefixed when the memory cap or the budget ran out.
std::optional<std::string> run_protected(Script::Impl& im, lua_CFunction fn);

// The function run_protected runs for a hook: im.hook with im.push's arguments, then checks
// what it returned with im.returns (nil required when there is none).
int run_current_hook(lua_State* L);

// One garbage-collection step when the state has grown since its last full cycle; true while
// the cycle it started is not finished.
bool collect_garbage_step(Script::Impl& im);

}  // namespace mpsteer::lua
