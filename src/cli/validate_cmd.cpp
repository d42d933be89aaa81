// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer validate [--output text|json] PATH...: check manifests like a compiler would, every
// problem as FILE:LINE:COL: error: /json/pointer: message. Exit 0 valid (warnings allowed),
// 1 invalid, 2 usage error (including a PATH that does not exist).
// mpsteer validate --host [PATH...]: what this host's kernel offers the datapath (every program
// through its verifier), and whether the policies can run here: exit 1 when they cannot.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "compile/compile.h"
#include "datapath/chain.h"
#include "datapath/kernel_probe.h"
#include "lb/balancer.h"
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
        if (!limits.empty()) {
            result.model.policies.clear();
            result.model.balancer.reset();
        }
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
        j["balancer"] =
            result.model.balancer ? nlohmann::json(result.model.balancer->name) : nlohmann::json();
        j["diagnostics"] = nlohmann::json::array();
        for (const auto& d : result.diagnostics) j["diagnostics"].push_back(diag_json(d));
        std::cout << j.dump(2) << '\n';
    } else {
        for (const auto& d : result.diagnostics) std::cout << d.format() << '\n';
        std::cerr << result.files.size() << " file(s), " << result.model.policies.size()
                  << " policies"
                  << (result.model.balancer ? ", balancer '" + result.model.balancer->name + "'"
                                            : std::string())
                  << ": " << errors << " error(s), " << warnings << " warning(s)\n";
    }
    return errors == 0 ? 0 : 1;
}

// The kernel's report, and the policies (if any) that cannot run on it. Returns the exit code.
int run_validate_host(const std::vector<std::string>& paths) {
    const auto k = datapath::probe_kernel();
    std::cout << "kernel:    " << k.release << " (" << k.machine << ")\n";
    if (!k.bpf_unusable.empty()) {
        std::cout << "bpf:       unusable: " << k.bpf_unusable << '\n';
        return 1;
    }
    std::cout << "bpf:       ok, JIT "
              << (k.jit ? "on" : "off (net.core.bpf_jit_enable=0: every program interpreted)")
              << "\nmptcp:     " << (k.mptcp ? "enabled" : "off (sysctl net.mptcp.enabled=1)")
              << "\ntc hooks:  " << (k.tcx ? "TCX links" : "clsact filters (TCX needs 6.6)")
              << "\nbtf:       " << (k.btf ? "present" : "absent (/sys/kernel/btf/vmlinux)")
              << "\ndatapath:  "
              << (k.without_btf.empty()
                      ? "built with CO-RE reads and subprogram calls"
                      : "built without kernel BTF (" + k.without_btf +
                            "): the option walk is a program of its own (one more tail call "
                            "per step that reads options), add_subflow's carrier goes a little "
                            "ahead of the socket's rcv_nxt, not at its window edge")
              << '\n';
    if (!k.load_failed.empty()) {
        std::cout << "programs:  the BPF object does not load: " << k.load_failed << '\n';
        return 1;
    }
    std::cout << "programs:  " << k.programs - k.programs_refused.size() << " of " << k.programs
              << " load\n";
    for (const auto& r : k.programs_refused)
        std::cout << "           refused: " << r.program << ": " << r.why << '\n';
    if (!k.programs_refused.empty())
        std::cout << "compiled:  not tried (programs refused)\n";
    else if (k.compiled_entry_refused.empty())
        std::cout << "compiled:  entries load\n";
    else
        std::cout << "compiled:  refused, chains run in the entry program: "
                  << k.compiled_entry_refused << '\n';
    // The load balancer (bpf/lb.bpf.c) is a program of its own: what a balancer node needs.
    try {
        lb::Balancer probe(lb::Sizes{1024, 1024, 251});
        std::cout << "balancer:  loads\n";
    } catch (const std::exception& e) {
        std::cout << "balancer:  refused (a balancer node cannot run here): " << e.what() << '\n';
    }
    if (paths.empty()) return k.programs_refused.empty() ? 0 : 1;
    // The policies: every step's program must be one this kernel loads (either hook's variant
    // refused counts: a policy may run at both).
    auto result = manifest::load_paths(paths);
    if (!result.ok()) {
        std::cout << "policies:  invalid (see mpsteer validate)\n";
        return 1;
    }
    const auto out = compile::compile(result.model);
    std::set<std::string> blocked;
    for (const auto& st : out.chains.steps) {
        const std::string name(datapath::prog_name(static_cast<mps_prog>(st.prog)));
        for (const auto& r : k.programs_refused)
            if (r.program == name + "_xdp" || r.program == name + "_tc")
                blocked.insert(out.chains.policies.at(st.policy) + " (its " + name +
                               " step: " + r.program + " refused)");
    }
    for (const auto& b : blocked) std::cout << "policy:    cannot run here: " << b << '\n';
    // The agent loads every program: one refused keeps it from running any policy.
    const bool runs = k.programs_refused.empty();
    std::cout << "policies:  " << result.model.policies.size() << " valid; "
              << (runs ? "the agent can run them here"
                       : "the agent cannot run here while programs are refused")
              << '\n';
    return runs ? 0 : 1;
}

}  // namespace

void add_validate_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("validate", "Validate policy manifests (files or directories)");
    static std::vector<std::string> paths;
    static std::string output = "text";
    static bool host = false;
    cmd->add_option("--output,-o", output, "text or json")
        ->check(CLI::IsMember({"text", "json"}))
        ->capture_default_str();
    cmd->add_flag("--host", host,
                  "check this host's kernel instead: every datapath program and a compiled "
                  "entry through its verifier (needs root), and whether the given policies "
                  "can run here");
    cmd->add_option("paths", paths, "manifest files or directories (required without --host)");
    cmd->callback([] {
        if (host) return set_exit_code(run_validate_host(paths));
        if (paths.empty()) throw CLI::RequiredError("paths");
        set_exit_code(run_validate(paths, output));
    });
}

}  // namespace mpsteer::cli
