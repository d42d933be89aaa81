#include "cli/commands.h"

namespace mpsteer::cli {
static int g_exit_code = 0;
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

// Declared here, defined in each <name>_cmd.cpp. Add one line per command.
std::vector<AddCommand> all_commands() {
    return {};
}
}  // namespace mpsteer::cli
