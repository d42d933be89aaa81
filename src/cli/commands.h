// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Subcommand registry. A command's callback stores its exit status with set_exit_code().
#pragma once
#include <vector>

namespace CLI {
class App;
}

namespace mpsteer::cli {
using AddCommand = void (*)(CLI::App&);
std::vector<AddCommand> all_commands();  // defined in commands.cpp: one line per command
void set_exit_code(int code);
int exit_code();
}  // namespace mpsteer::cli
