// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The hostile hook scripts of tests/unit/lua_hostile/, read from the source tree
// (compile definition MPS_SOURCE_DIR) for the tests that run them.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

inline std::string hostile_script(const std::string& name) {
    std::ifstream in(std::string(MPS_SOURCE_DIR) + "/tests/unit/lua_hostile/" + name);
    REQUIRE(in);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}
