// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The script API (internal to mpsteer_lua): the `mpsteer` table and `params` global a script
// sees, their functions calling the Backend, and the conversions between the host's types
// (Connection, Subflow, AddAddr, JSON) and Lua tables. Documented for script writers in
// lua/README.md. Every function here may raise Lua errors: call them inside a protected call
// (sandbox.h).
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "lua/hooks.h"

struct lua_State;

namespace mpsteer::lua {

// Each pushes one table (nil for JSON null) onto the stack.
void push_subflow(lua_State* L, const Subflow& s);
void push_connection(lua_State* L, const Connection& c);
void push_add_addr(lua_State* L, const AddAddr& a);
void push_link(lua_State* L, const Link& l);
void push_json(lua_State* L, const nlohmann::json& j);

// {rate = N, backup = bool} at idx; unknown keys are errors naming `what`.
SubflowSettings check_settings(lua_State* L, int idx, const char* what);
// Sends the settings to the Backend for the script's policy, counts the write, pushes whether
// the subflow was there.
int apply_settings(lua_State* L, uint64_t id, const SubflowSettings& s);
// A hook's returned settings (Backend::set_subflow_returned): counted as one write.
void apply_returned_settings(lua_State* L, uint64_t id, const SubflowSettings& s);

// Sets the globals `mpsteer` (the API, with the script's policy and every_ms) and `params`.
void open_script_api(lua_State* L);

}  // namespace mpsteer::lua
