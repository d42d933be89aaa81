// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "cli/commands.h"

namespace mpsteer::cli {
static int g_exit_code = 0;
void set_exit_code(int code) {
    g_exit_code = code;
}
int exit_code() {
    return g_exit_code;
}

// Defined in each <name>_cmd.cpp. One line per command, here and in the list below.
void add_bench_command(CLI::App&);
void add_validate_command(CLI::App&);
void add_plan_command(CLI::App&);
void add_demo_command(CLI::App&);
void add_agent_commands(CLI::App&);
void add_usecases_command(CLI::App&);

std::vector<AddCommand> all_commands() {
    return {
        add_bench_command, add_validate_command, add_plan_command,
        add_demo_command,  add_agent_commands,  add_usecases_command,
    };
}
}  // namespace mpsteer::cli
