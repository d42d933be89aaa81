// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer: what a node runs, one subcommand per job. The test bed's commands (demo, usecases,
// bench --live) are another binary, mpsteer-lab, which `mpsteer` runs for them with the same
// arguments: the daemon does not carry the lab.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "cli/commands.h"
#include "lua/hook_process.h"

namespace mpsteer::cli {
// Defined in each <name>_cmd.cpp.
void add_bench_command(CLI::App&);
void add_validate_command(CLI::App&);
void add_plan_command(CLI::App&);
void add_agent_commands(CLI::App&);
}  // namespace mpsteer::cli

namespace {
using namespace mpsteer::cli;

constexpr const char* kLab = "mpsteer-lab";

// The index of the subcommand when it is one of mpsteer-lab's (after the global flags), else 0.
int lab_command(int argc, char** argv) {
    int i = 1;
    while (i < argc && (std::strcmp(argv[i], "-v") == 0 || std::strcmp(argv[i], "--verbose") == 0))
        ++i;
    if (i >= argc) return 0;
    const std::string_view cmd = argv[i];
    if (cmd == "demo" || cmd == "usecases") return i;
    if (cmd == "bench")
        for (int j = i + 1; j < argc; ++j)
            if (std::string_view(argv[j]) == "--live") return i;
    return 0;
}

[[noreturn]] void run_lab(char** argv) {
    const std::string lab = companion_binary(kLab);
    if (lab.empty()) {
        std::fprintf(stderr,
                     "mpsteer: %s is the test bed's binary (demo, usecases, bench --live) and it "
                     "is not installed beside mpsteer (nor in ../lib/mpsteer)\n",
                     kLab);
        _exit(1);
    }
    execv(lab.c_str(), argv);  // argv[0] kept: its usage lines say `mpsteer demo`
    std::fprintf(stderr, "mpsteer: running %s: %s\n", lab.c_str(), std::strerror(errno));
    _exit(1);
}

// Listed in `mpsteer --help`; main() hands them to mpsteer-lab before parsing.
void add_lab_commands(CLI::App& app) {
    app.add_subcommand(
           "demo",
           "Build a two-namespace MPTCP lab, run the agent with the shipped policies on "
           "it and show them acting on live traffic (needs root; the test bed, "
           "mpsteer-lab: `mpsteer demo --help`)")
        ->allow_extras();
    app.add_subcommand("usecases",
                       "Reproduce mpsteer's use cases in a throw-away lab, with and without the "
                       "agent, each figure beside its target (needs root; the test bed, "
                       "mpsteer-lab: `mpsteer usecases --help`)")
        ->allow_extras();
}
}  // namespace

int main(int argc, char** argv) {
    // A closed stderr (a pipe whose reader went away) must not kill the agent: writes fail with
    // EPIPE instead. SIGUSR1 is the agent's (it logs a summary); elsewhere it must not kill.
    signal(SIGPIPE, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    // The agent's hook process (src/lua/hook_process.h): not a command for people; it speaks
    // only the agent's protocol on fd 3.
    if (argc == 2 && std::string_view(argv[1]) == "hook-host")
        return mpsteer::lua::run_hook_host(3);
    if (lab_command(argc, argv)) run_lab(argv);
    return run_app(argc, argv, "mpsteer: declarative, eBPF-enforced Multipath TCP policies",
                   {add_bench_command, add_validate_command, add_plan_command, add_agent_commands,
                    add_lab_commands});
}
