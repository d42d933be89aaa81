// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What the two binaries share: mpsteer (what a node runs: src/cli) and mpsteer-lab (the test
// bed: demo, use cases, the live benchmark; src/testbed). Each subcommand registers itself from
// its own <name>_cmd.cpp; a command's callback stores its exit status with set_exit_code().
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace mpsteer::cli {
using AddCommand = void (*)(CLI::App&);
void set_exit_code(int code);
int exit_code();

// A binary's main(): logs to stderr with every line escaped, -v for debug, one of `commands`;
// usage errors exit 2, an exception a command did not report exits 1.
int run_app(int argc, char** argv, const char* title, const std::vector<AddCommand>& commands);

// The other binary of the pair (mpsteer, mpsteer-lab): beside this one (the build tree), or
// where the package puts it (/usr/bin/mpsteer, /usr/lib/mpsteer/mpsteer-lab). Empty if neither.
std::string companion_binary(const std::string& name);
}  // namespace mpsteer::cli
