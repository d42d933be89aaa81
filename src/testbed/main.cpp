// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer-lab: the test bed, apart from what a node runs. It builds throw-away namespace labs
// and runs the node's binary (mpsteer) on them: the demo, the use cases, the live benchmark.
// `mpsteer demo|usecases|bench --live` run this binary with the same arguments.
#include <signal.h>

#include "cli/commands.h"

namespace mpsteer::cli {
// Defined in demo_cmd.cpp, usecases_cmd.cpp, bench_live.cpp.
void add_demo_command(CLI::App&);
void add_usecases_command(CLI::App&);
void add_live_bench_command(CLI::App&);
}  // namespace mpsteer::cli

int main(int argc, char** argv) {
    signal(SIGPIPE, SIG_IGN);  // a closed stderr pipe fails writes, not the run
    using namespace mpsteer::cli;
    return run_app(argc, argv, "mpsteer-lab: mpsteer's test bed (demo, use cases, live benchmark)",
                   {add_demo_command, add_usecases_command, add_live_bench_command});
}
