// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer validate [--output text|json] PATH...: check manifests like a compiler would, every
// problem as FILE:LINE:COL: error: /json/pointer: message. Exit 0 valid (warnings allowed),
// 1 invalid, 2 usage error (including a PATH that does not exist).
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "compile/compile.h"
#include "manifest/manifest.h"

namespace mpsteer::cli {
namespace {

nlohmann::json diag_json(const manifest::Diagnostic& d) {
    return {{"file", d.pos.file},
            {"line", d.pos.line},
            {"col", d.pos.col},
            {"severity", d.severity == manifest::Severity::error ? "error" : "warning"},
            {"pointer", d.pointer},
            {"message", d.message}};
}

int run_validate(const std::vector<std::string>& paths, const std::string& output) {
    for (const auto& p : paths) {
        std::error_code ec;
        if (!std::filesystem::exists(p, ec)) {
            std::cerr << "mpsteer validate: " << p << ": no such file or directory\n";
            return 2;
        }
    }
    auto result = manifest::load_paths(paths);
    if (result.ok()) {
        // The limits of the datapath's step table, at the policy to edit.
        auto limits = compile::check_limits(result.model);
        result.diagnostics.insert(result.diagnostics.end(), limits.begin(), limits.end());
        manifest::sort_diagnostics(result.diagnostics);
        if (!limits.empty()) result.model.policies.clear();
    }
    size_t errors = 0, warnings = 0;
    for (const auto& d : result.diagnostics)
        (d.severity == manifest::Severity::error ? errors : warnings)++;
    if (output == "json") {
        nlohmann::json j;
        j["valid"] = errors == 0;
        j["files"] = result.files;
        j["policies"] = nlohmann::json::array();
        for (const auto& p : result.model.policies) j["policies"].push_back(p.name);
        j["diagnostics"] = nlohmann::json::array();
        for (const auto& d : result.diagnostics) j["diagnostics"].push_back(diag_json(d));
        std::cout << j.dump(2) << '\n';
    } else {
        for (const auto& d : result.diagnostics) std::cout << d.format() << '\n';
        std::cerr << result.files.size() << " file(s), " << result.model.policies.size()
                  << " policies: " << errors << " error(s), " << warnings << " warning(s)\n";
    }
    return errors == 0 ? 0 : 1;
}

}  // namespace

void add_validate_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("validate", "Validate policy manifests (files or directories)");
    static std::vector<std::string> paths;
    static std::string output = "text";
    cmd->add_option("--output,-o", output, "text or json")
        ->check(CLI::IsMember({"text", "json"}))
        ->capture_default_str();
    cmd->add_option("paths", paths, "manifest files or directories")->required();
    cmd->callback([] { set_exit_code(run_validate(paths, output)); });
}

}  // namespace mpsteer::cli
