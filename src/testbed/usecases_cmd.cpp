// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer usecases: the use cases mpsteer is for, reproduced in the lab against the kernel's
// defaults. Every use case runs in rounds; each round runs every mode once (the kernel as
// configured, and the same with the real agent running the shipped policies), the order
// alternating round by round so that drift in the machine falls on both. Figures are summed
// over the rounds and printed beside their targets, as a table or as JSON.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sstream>

#include "testbed/agent_process.h"
#include "cli/commands.h"
#include "testbed/usecases.h"
#include "lab/lab.h"

namespace mpsteer::cli {
namespace usecases {
namespace {
namespace fs = std::filesystem;
std::atomic<bool> g_stop{false};
}  // namespace

void check_stop() {
    if (g_stop) throw lab::Error("interrupted");
}

bool Report::met() const {
    for (const auto& f : figures)
        for (const auto& c : f.cells)
            if (c.met && !*c.met) return false;
    return true;
}

Cell count_cell(uint64_t v) {
    return Cell{v, std::to_string(v), std::nullopt};
}

Cell zero_cell(uint64_t v, bool mpsteer) {
    Cell c = count_cell(v);
    if (mpsteer) c.met = v == 0;
    return c;
}

std::string percent(unsigned part, unsigned whole) {
    char b[64];
    std::snprintf(b, sizeof b, "%u (%.0f %%)", part, whole ? 100.0 * part / whole : 0.0);
    return b;
}

std::string fixed(double v, int decimals) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", decimals, v);
    return b;
}

AdaptedShare::AdaptedShare(const std::string& share, const std::string& dir,
                           const std::vector<std::pair<std::string, Replacements>>& files)
    : dir_(dir) {
    try {
        fs::remove_all(dir_);
        fs::create_directories(dir_ + "/policies");
        fs::create_directories(dir_ + "/lua");
        for (const auto& [rel, replace] : files) {
            const std::string from_path = shipped_path(share, rel);
            std::ifstream in(from_path);
            std::ostringstream text;
            text << in.rdbuf();
            std::string s = text.str();
            if (s.empty()) throw lab::Error("cannot read " + from_path);
            for (const auto& [from, to] : replace) {
                auto at = s.find(from);
                if (at == std::string::npos)
                    throw lab::Error(from_path + " no longer names " + from +
                                     "; the use case rewrites it for its lab");
                for (; at != std::string::npos; at = s.find(from, at + to.size()))
                    s.replace(at, from.size(), to);
            }
            fs::create_directories(fs::path(dir_ + "/" + rel).parent_path());
            std::ofstream(dir_ + "/" + rel) << s;
        }
    } catch (...) {
        remove();
        throw;
    }
}

PolicyAgent::PolicyAgent(
    const Options& opt, const std::string& netns, const std::string& name,
    const std::vector<std::pair<std::string, AdaptedShare::Replacements>>& files)
    : share_(opt.share, "/run/mpsteer-" + name + "-share", files),
      agent_(share_.share(), netns, name) {
    agent_.wait_ready();
}

AdaptedShare::~AdaptedShare() {
    remove();
}

void AdaptedShare::remove() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

std::string draw_plot(const Plot& p, const std::string& dir, const std::string& share) {
    fs::create_directories(dir);
    nlohmann::ordered_json spec{{"title", p.title},
                                {"xlabel", p.xlabel},
                                {"ylabel", p.ylabel},
                                {"kind", p.kind},
                                {"series", nlohmann::ordered_json::array()}};
    for (const auto& s : p.series)
        spec["series"].push_back({{"label", s.label}, {"x", s.x}, {"y", s.y}});
    const std::string stem = dir + "/" + p.file;
    std::ofstream(stem + ".json") << spec.dump() << '\n';
    const std::string script = share + "/tools/plot_usecases.py";
    // Debian's interpreter: the one python3-matplotlib is for (a python3 earlier in PATH may
    // lack it).
    const auto r = lab::run({"/usr/bin/python3", script, stem + ".json", stem + ".png"});
    if (r.status != 0)
        throw lab::Error("cannot draw " + stem + ".png with " + script +
                         " (needs python3-matplotlib): " + r.out);
    return stem + ".png";
}

}  // namespace usecases

namespace {
using namespace usecases;
using Clock = std::chrono::steady_clock;

struct UseCase {
    const char* name;
    const char* title;
    Report (*run)(const Options&);
};
const std::vector<UseCase>& use_cases() {
    static const std::vector<UseCase> all = {
        {"lb", "servers behind a stateless load balancer", load_balancer},
        {"lb-token", "joins routed by token", token_balancer},
        {"tenants", "multi-tenant spreading", multi_tenant},
        {"smallflow", "small-flow path manager", small_flows},
        {"ecf", "ECF scheduling", ecf_scheduling},
        {"disjoint", "disjoint subflows for large flows", disjoint_subflows},
        {"resilience", "paths that fail and come back", path_resilience},
    };
    return all;
}

void print_text(const Report& r, const Options& opt) {
    std::printf("%s (%s): %d rounds, %.0f s\n  %s\n\n", r.title.c_str(), r.name.c_str(), opt.rounds,
                r.seconds, r.setup.c_str());
    std::printf("  %-46s %-8s", "figure", "target");
    for (const auto& c : r.columns) std::printf(" %-18s", c.c_str());
    std::printf("\n");
    for (const auto& f : r.figures) {
        std::printf("  %-46s %-8s", f.label.c_str(), f.target.empty() ? "-" : f.target.c_str());
        for (const auto& c : f.cells) {
            std::string text = c.text;
            if (c.met) text += *c.met ? " ok" : " MISSED";
            std::printf(" %-18s", text.c_str());
        }
        std::printf("\n");
    }
    bool judged = false;
    for (const auto& f : r.figures)
        for (const auto& c : f.cells) judged |= c.met.has_value();
    if (judged)
        std::printf("  targets apply to the mpsteer columns: %s\n",
                    r.met() ? "all met" : "NOT ALL MET");
    else
        std::printf("  no targets: the figures are what a policy is measured against\n");
    std::printf("\n");
}

nlohmann::ordered_json to_json(const Report& r) {
    nlohmann::ordered_json j;
    j["name"] = r.name;
    j["title"] = r.title;
    j["setup"] = r.setup;
    j["seconds"] = r.seconds;
    j["targets_met"] = r.met();
    j["columns"] = r.columns;
    for (const auto& f : r.figures) {
        nlohmann::ordered_json fig;
        fig["key"] = f.key;
        fig["label"] = f.label;
        fig["target"] =
            f.target.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(f.target);
        for (size_t i = 0; i < f.cells.size(); i++) {
            fig["values"][r.columns[i]] = f.cells[i].value;
            if (f.cells[i].met) fig["met"][r.columns[i]] = *f.cells[i].met;
        }
        j["figures"].push_back(fig);
    }
    return j;
}

std::vector<std::string> draw_plots(const Report& r, const std::string& dir,
                                    const std::string& share) {
    std::vector<std::string> drawn;
    for (const auto& p : r.plots) drawn.push_back(draw_plot(p, dir, share));
    return drawn;
}

int run_use_cases(const Options& opt, const std::vector<std::string>& only, bool json,
                  const std::string& plots) {
    if (geteuid() != 0) {
        spdlog::error("usecases: needs root (network namespaces, BPF)");
        return 1;
    }
    const auto t0 = Clock::now();
    nlohmann::ordered_json out;
    out["rounds"] = opt.rounds;
    bool met = true, plots_failed = false;
    for (const auto& uc : use_cases()) {
        if (!only.empty() && std::find(only.begin(), only.end(), uc.name) == only.end()) continue;
        if (!json) {
            std::printf("running %s: %s ...\n", uc.name, uc.title);
            std::fflush(stdout);
        }
        const auto start = Clock::now();
        Report r = uc.run(opt);
        r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        met = met && r.met();
        // The figures first: a plot that cannot be drawn must not lose a long run's table.
        if (json)
            out["usecases"].push_back(to_json(r));
        else
            print_text(r, opt);
        if (!plots.empty()) {
            try {
                for (const auto& png : draw_plots(r, plots, opt.share))
                    if (!json) std::printf("wrote %s\n", png.c_str());
            } catch (const std::exception& e) {
                spdlog::error("usecases: {}", e.what());
                plots_failed = true;
            }
        }
    }
    out["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
    out["targets_met"] = met;
    if (json) std::printf("%s\n", out.dump(2).c_str());
    return met && !plots_failed ? 0 : 1;
}

}  // namespace

void add_usecases_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "usecases",
        "Reproduce mpsteer's use cases in a throw-away lab, with and without the agent and the "
        "shipped policies, and print each figure beside its target (needs root; exit 1 when a "
        "target is missed)");
    static Options opt{.share = default_share()};
    static bool json = false;
    static std::vector<std::string> only;
    static std::string plots;
    std::vector<std::string> names;
    for (const auto& uc : use_cases()) names.push_back(uc.name);
    cmd->add_flag("--json", json, "print one JSON object instead of the tables");
    cmd->add_option("--rounds", opt.rounds,
                    "rounds; each runs every mode once, the order alternating")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    cmd->add_option("--connections", opt.connections, "lb: MPTCP connections per run")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    cmd->add_option("--plots", plots,
                    "also write each use case's plots (PNG, with their data as JSON) into this "
                    "directory (needs python3-matplotlib)");
    cmd->add_option("--only", only, "run only these use cases")->check(CLI::IsMember(names));
    cmd->add_option("--share", opt.share,
                    "where the shipped policies/ and lua/ are (the agents get adapted copies)")
        ->check(CLI::ExistingDirectory)
        ->capture_default_str();
    cmd->callback([] {
        std::signal(SIGINT, [](int) { usecases::g_stop = true; });
        std::signal(SIGTERM, [](int) { usecases::g_stop = true; });
        try {
            set_exit_code(run_use_cases(opt, only, json, plots));
        } catch (const std::exception& e) {
            spdlog::error("usecases: {}", e.what());
            set_exit_code(1);
        }
    });
}

}  // namespace mpsteer::cli
