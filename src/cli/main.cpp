// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer: one binary, one subcommand per job. Each subcommand registers itself from its own
// <name>_cmd.cpp; this file only wires them together.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"

int main(int argc, char** argv) {
    // Logs go to stderr: stdout carries results (validate, plan, status, events, bench).
    spdlog::set_default_logger(spdlog::stderr_color_mt("mpsteer"));
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    CLI::App app{"mpsteer: declarative, eBPF-enforced Multipath TCP policies"};
    app.require_subcommand(1);
    bool verbose = false;
    app.add_flag("-v,--verbose", verbose, "debug logging");
    app.parse_complete_callback([&] {
        if (verbose) spdlog::set_level(spdlog::level::debug);
    });
    for (auto add : mpsteer::cli::all_commands()) add(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;  // usage errors exit 2
    } catch (const std::exception& e) {  // what a command did not report itself
        spdlog::error("{}", e.what());
        return 1;
    }
    return mpsteer::cli::exit_code();
}
