// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer plan [--output text|json] DIR: what applying DIR would change against the running
// generation (its description in /run/mpsteer/state/applied.json; empty when absent).
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "compile/compile.h"
#include "manifest/manifest.h"

namespace mpsteer::cli {
namespace {

int run_plan(const std::string& dir, const std::string& output, const std::string& state) {
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) {
        std::cerr << "mpsteer plan: " << dir << ": no such file or directory\n";
        return 2;
    }
    auto result = manifest::load_paths({dir});
    for (const auto& d : result.diagnostics) std::cerr << d.format() << '\n';
    if (!result.ok()) {
        std::cerr << "mpsteer plan: the manifests are invalid; nothing would be applied\n";
        return 1;
    }
    compile::PlanModel running, next;
    try {
        next = compile::make_plan_model(result.model, compile::compile(result.model));
        if (auto applied = compile::read_applied(state)) running = std::move(*applied);
    } catch (const compile::Error& e) {
        std::cerr << "mpsteer plan: " << e.what() << '\n';
        return 1;
    }
    auto d = compile::diff(running, next);
    if (output == "json") {
        auto j = compile::to_json(d);
        j["running_revision"] = running.revision;
        std::cout << j.dump(2) << '\n';
    } else {
        std::cout << compile::to_text(d);
    }
    return 0;
}

}  // namespace

void add_plan_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("plan", "Show what applying a policy directory would change");
    static std::string dir, state = compile::kAppliedStatePath;
    static std::string output = "text";
    cmd->add_option("--output,-o", output, "text or json")
        ->check(CLI::IsMember({"text", "json"}))
        ->capture_default_str();
    cmd->add_option("--state", state, "the running generation's description")
        ->capture_default_str();
    cmd->add_option("dir", dir, "policy directory")->required();
    cmd->callback([] { set_exit_code(run_plan(dir, output, state)); });
}

}  // namespace mpsteer::cli
