// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer usecases: the use cases mpsteer is for, reproduced in the lab against the kernel's
// defaults. Every use case runs in rounds; each round runs every mode once (the kernel as
// configured, and the same with the real agent running the shipped policies), the order
// alternating round by round so that drift in the machine falls on both. Figures are summed
// over the rounds and printed beside their targets, as a table or as JSON.
//
// Use cases:
//  - lb: servers behind a stateless load balancer (Duchene & Bonaventure, ICNP 2017), with
//    policies/lb-unique-address.yaml and policies/mp-join-guard.yaml on every backend.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <spdlog/spdlog.h>
#include <sstream>
#include <thread>

#include "cli/agent_process.h"
#include "cli/commands.h"
#include "lab/lab.h"

namespace mpsteer::cli {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace mpsteer::lab;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};

void check_stop() {
    if (g_stop) throw Error("interrupted");
}

struct Options {
    int rounds = 3;
    unsigned connections = 40;
    std::string share;
};

// ---- what every use case reports -----------------------------------------------------------

// One figure in one column: the number for JSON, its text for the table, and whether it
// meets the figure's target (only in the columns the target is for).
struct Cell {
    nlohmann::ordered_json value;
    std::string text;
    std::optional<bool> met;
};
struct Figure {
    std::string key, label, target;  // target: text, empty when the figure is only shown
    std::vector<Cell> cells;         // one per column
};
struct Report {
    std::string name, title, setup;
    std::vector<std::string> columns;  // "ipv4 kernel", "ipv4 mpsteer", ...
    std::vector<Figure> figures;
    double seconds = 0;
    bool met() const {
        for (const auto& f : figures)
            for (const auto& c : f.cells)
                if (c.met && !*c.met) return false;
        return true;
    }
};

// ---- servers behind a stateless load balancer ----------------------------------------------

constexpr uint16_t kServicePort = 443;  // the port the shipped lb-vip-service selector names

// The shipped policies that belong on a backend, rewritten for one backend of the lab: the
// VIP and unique address they name become the lab's (only the addresses change).
class BackendPolicies {
public:
    BackendPolicies(const std::string& share, const std::string& dir, int backend, int family)
        : dir_(dir) {
        try {
            fs::remove_all(dir_);
            fs::create_directories(dir_ + "/policies/shared");
            fs::create_directories(dir_ + "/lua");
            const std::string host = family == 6 ? "/128" : "/32";
            const std::pair<std::string, std::string> vip{"203.0.113.10/32",
                                                          LoadBalancerLab::vip(family) + host};
            const std::pair<std::string, std::string> unique{
                "198.51.100.20/32", LoadBalancerLab::unique_addr(backend, family) + host};
            copy(share, "policies/shared/lb-vip.yaml", {vip});
            copy(share, "policies/lb-unique-address.yaml", {});
            copy(share, "policies/mp-join-guard.yaml", {unique});
        } catch (...) {
            remove();
            throw;
        }
    }
    ~BackendPolicies() { remove(); }
    BackendPolicies(const BackendPolicies&) = delete;
    BackendPolicies& operator=(const BackendPolicies&) = delete;
    const std::string& share() const { return dir_; }  // holds policies/ and lua/

private:
    void remove() {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    void copy(const std::string& share, const std::string& rel,
              const std::vector<std::pair<std::string, std::string>>& replace) {
        std::ifstream in(share + "/" + rel);
        std::ostringstream text;
        text << in.rdbuf();
        std::string s = text.str();
        if (s.empty()) throw Error("cannot read " + share + "/" + rel);
        for (const auto& [from, to] : replace) {
            auto at = s.find(from);
            if (at == std::string::npos)
                throw Error(share + "/" + rel + " no longer names " + from +
                            "; the load-balancer use case rewrites that address");
            for (; at != std::string::npos; at = s.find(from, at + to.size()))
                s.replace(at, from.size(), to);
        }
        std::ofstream(dir_ + "/" + rel) << s;
    }
    std::string dir_;
};

// What one run (one family, one mode, `connections` connections) measured.
struct LbTally {
    unsigned connections = 0, with_extra_subflow = 0, resets = 0, fallbacks = 0;
    uint64_t joins_received = 0, joins_failed = 0;  // the backends' MIB
    unsigned vip_subflows = 0, vip_subflows_backup = 0, unique_subflows = 0;

    LbTally& operator+=(const LbTally& o) {
        connections += o.connections;
        with_extra_subflow += o.with_extra_subflow;
        resets += o.resets;
        fallbacks += o.fallbacks;
        joins_received += o.joins_received;
        joins_failed += o.joins_failed;
        vip_subflows += o.vip_subflows;
        vip_subflows_backup += o.vip_subflows_backup;
        unique_subflows += o.unique_subflows;
        return *this;
    }
};

uint64_t mib_sum(const LoadBalancerLab& lab, const char* counter) {
    uint64_t n = 0;
    for (int b = 1; b <= LoadBalancerLab::kBackends; b++) {
        const auto c = mptcp_counters(lab.backend_ns(b));
        auto it = c.find(counter);
        if (it == c.end()) throw Error(std::string("this kernel has no MPTcpExt ") + counter);
        n += it->second;
    }
    return n;
}

std::string endpoint(const std::string& addr, int family) {
    return (family == 6 ? "[" + addr + "]" : addr) + ":" + std::to_string(kServicePort);
}

// One run: the connections open, send a little every 100 ms for 2 s (the backends' ACKs
// carry set_backup's MP_PRIO), then what the client's kernel shows and the backends counted.
LbTally lb_run(const LoadBalancerLab& lab, int family, bool with_mpsteer, const Options& opt,
               const std::string& tag, int round) {
    std::vector<std::unique_ptr<BackendPolicies>> policies;
    std::vector<std::unique_ptr<ShippedAgent>> agents;
    if (with_mpsteer) {
        for (int b = 1; b <= LoadBalancerLab::kBackends; b++) {
            const std::string name = "uc-" + tag + "-b" + std::to_string(b);
            policies.push_back(std::make_unique<BackendPolicies>(
                opt.share, "/run/mpsteer-" + name + "-share", b, family));
            agents.push_back(
                std::make_unique<ShippedAgent>(policies.back()->share(), lab.backend_ns(b), name));
        }
        for (auto& a : agents) a->wait_ready(60s);
    }
    std::vector<std::unique_ptr<Discard>> servers;
    for (int b = 1; b <= LoadBalancerLab::kBackends; b++)
        servers.push_back(std::make_unique<Discard>(lab.backend_ns(b), kServicePort, family == 6));

    const uint64_t syn_rx0 = mib_sum(lab, "MPJoinSynRx");
    const uint64_t no_token0 = mib_sum(lab, "MPJoinNoTokenFound");
    LbTally t;
    {
        ConnectionSet conns(lab.client_ns(), LoadBalancerLab::vip(family), kServicePort,
                            opt.connections);
        for (int tick = 0; tick < 20; tick++) {
            check_stop();
            conns.send_each(4096);
            std::this_thread::sleep_for(100ms);
        }
        for (const auto& st : conns.states()) {
            t.connections++;
            if (st.subflows >= 1) t.with_extra_subflow++;
            if (st.error || st.closed) t.resets++;
            if (st.fallback) t.fallbacks++;
        }
        const std::string vip = endpoint(LoadBalancerLab::vip(family), family);
        for (const auto& sf : tcp_subflows(lab.client_ns())) {
            if (sf.mptcp_flags.empty()) continue;
            if (sf.remote == vip) {
                t.vip_subflows++;
                if (sf.mptcp_flags.find('B') != std::string::npos) t.vip_subflows_backup++;
            }
            // Backends announce both families' unique addresses; an IPv6 socket reaches the
            // IPv4 one as a mapped address.
            for (int b = 1; b <= LoadBalancerLab::kBackends; b++) {
                const std::string u4 = LoadBalancerLab::unique_addr(b, 4);
                if (sf.remote == endpoint(u4, 4) || sf.remote == endpoint("::ffff:" + u4, 6) ||
                    sf.remote == endpoint(LoadBalancerLab::unique_addr(b, 6), 6))
                    t.unique_subflows++;
            }
        }
    }
    std::this_thread::sleep_for(200ms);  // the closes reach the backends
    t.joins_received = mib_sum(lab, "MPJoinSynRx") - syn_rx0;
    t.joins_failed = mib_sum(lab, "MPJoinNoTokenFound") - no_token0;
    spdlog::info("lb round {} IPv{} {}: {} connections, {} with an extra subflow, {} joins "
                 "received, {} failed, {} resets, VIP subflows {} ({} backup), {} to unique "
                 "addresses",
                 round + 1, family, with_mpsteer ? "mpsteer" : "kernel", t.connections,
                 t.with_extra_subflow, t.joins_received, t.joins_failed, t.resets, t.vip_subflows,
                 t.vip_subflows_backup, t.unique_subflows);
    return t;
}

std::string percent(unsigned part, unsigned whole) {
    char b[64];
    std::snprintf(b, sizeof b, "%u (%.0f %%)", part, whole ? 100.0 * part / whole : 0.0);
    return b;
}

Report load_balancer(const Options& opt) {
    Report r;
    r.name = "lb";
    r.title = "servers behind a stateless load balancer";
    r.setup = "2 backends share a VIP behind an ECMP route hashing the 5-tuple; the client opens " +
              std::to_string(opt.connections) +
              " MPTCP connections per run to the VIP, its path manager adding a subflow from its "
              "second address; backends announce their unique address (ADD_ADDR); mpsteer: "
              "lb-unique-address.yaml and mp-join-guard.yaml on each backend";
    const std::string tag = "u" + std::to_string(getpid() % 1000000);
    LoadBalancerLab lab(tag);
    LbTally sum[2][2];  // [IPv4, IPv6][kernel, mpsteer]
    for (int round = 0; round < opt.rounds; round++)
        for (int f = 0; f < 2; f++)
            for (int m : {round % 2, 1 - round % 2})
                sum[f][m] += lb_run(lab, f ? 6 : 4, m == 1, opt, tag, round);

    struct Spec {
        const char* key;
        const char* label;
        const char* target;
        std::function<Cell(const LbTally&, bool mpsteer)> cell;
    };
    auto number = [](uint64_t v) { return Cell{v, std::to_string(v), std::nullopt}; };
    // A count mpsteer must keep at zero (the kernel's column only shows it).
    auto zero_with_mpsteer = [&](uint64_t (*count)(const LbTally&)) {
        return [&number, count](const LbTally& t, bool mpsteer) {
            Cell c = number(count(t));
            if (mpsteer) c.met = count(t) == 0;
            return c;
        };
    };
    const std::vector<Spec> specs = {
        {"connections", "connections", "", [&](const LbTally& t, bool) { return number(t.connections); }},
        {"with_extra_subflow", "connections with >= 2 subflows", "100 %",
         [](const LbTally& t, bool mpsteer) {
             Cell c{t.with_extra_subflow, percent(t.with_extra_subflow, t.connections), {}};
             if (mpsteer) c.met = t.connections && t.with_extra_subflow == t.connections;
             return c;
         }},
        {"joins_received", "MP_JOIN SYNs at the backends (MIB)", "",
         [&](const LbTally& t, bool) { return number(t.joins_received); }},
        {"joins_failed", "joins failed: no token (MIB)", "0",
         zero_with_mpsteer([](const LbTally& t) -> uint64_t { return t.joins_failed; })},
        {"unique_address_subflows", "subflows to a unique address (either family)", "",
         [&](const LbTally& t, bool) { return number(t.unique_subflows); }},
        {"resets", "connections reset", "0",
         zero_with_mpsteer([](const LbTally& t) -> uint64_t { return t.resets; })},
        {"fallbacks", "connections fallen back to TCP", "0",
         zero_with_mpsteer([](const LbTally& t) -> uint64_t { return t.fallbacks; })},
        {"vip_subflow_backup", "VIP subflow backup", "yes",
         [](const LbTally& t, bool mpsteer) {
             const bool all = t.vip_subflows && t.vip_subflows_backup == t.vip_subflows;
             Cell c{nlohmann::ordered_json{{"subflows", t.vip_subflows},
                                           {"backup", t.vip_subflows_backup}},
                    std::string(all ? "yes" : t.vip_subflows_backup ? "partly" : "no") + " (" +
                        std::to_string(t.vip_subflows_backup) + "/" +
                        std::to_string(t.vip_subflows) + ")",
                    {}};
             if (mpsteer) c.met = all;
             return c;
         }},
    };
    for (const char* family : {"ipv4", "ipv6"})
        for (const char* mode : {"kernel", "mpsteer"})
            r.columns.push_back(std::string(family) + " " + mode);
    for (const auto& s : specs) {
        Figure fig{s.key, s.label, s.target, {}};
        for (int f = 0; f < 2; f++)
            for (int m = 0; m < 2; m++) fig.cells.push_back(s.cell(sum[f][m], m == 1));
        r.figures.push_back(std::move(fig));
    }
    return r;
}

// ---- the frame -----------------------------------------------------------------------------

struct UseCase {
    const char* name;
    const char* title;
    Report (*run)(const Options&);
};
const std::vector<UseCase>& use_cases() {
    static const std::vector<UseCase> all = {
        {"lb", "servers behind a stateless load balancer", load_balancer},
    };
    return all;
}

void print_text(const Report& r, const Options& opt) {
    std::printf("%s (%s): %d rounds, %.0f s\n  %s\n\n", r.title.c_str(), r.name.c_str(),
                opt.rounds, r.seconds, r.setup.c_str());
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
    std::printf("  targets apply to the mpsteer columns: %s\n\n", r.met() ? "all met" : "NOT ALL MET");
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
        fig["target"] = f.target.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(f.target);
        for (size_t i = 0; i < f.cells.size(); i++) {
            fig["values"][r.columns[i]] = f.cells[i].value;
            if (f.cells[i].met) fig["met"][r.columns[i]] = *f.cells[i].met;
        }
        j["figures"].push_back(fig);
    }
    return j;
}

int run_use_cases(const Options& opt, const std::vector<std::string>& only, bool json) {
    if (geteuid() != 0) {
        spdlog::error("usecases: needs root (network namespaces, BPF)");
        return 1;
    }
    const auto t0 = Clock::now();
    nlohmann::ordered_json out;
    out["rounds"] = opt.rounds;
    bool met = true;
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
        if (json)
            out["usecases"].push_back(to_json(r));
        else
            print_text(r, opt);
    }
    out["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
    out["targets_met"] = met;
    if (json) std::printf("%s\n", out.dump(2).c_str());
    return met ? 0 : 1;
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
    cmd->add_option("--only", only, "run only these use cases")->check(CLI::IsMember(names));
    cmd->add_option("--share", opt.share,
                    "where the shipped policies/ and lua/ are (the agents get adapted copies)")
        ->check(CLI::ExistingDirectory)
        ->capture_default_str();
    cmd->callback([] {
        std::signal(SIGINT, [](int) { g_stop = true; });
        std::signal(SIGTERM, [](int) { g_stop = true; });
        try {
            set_exit_code(run_use_cases(opt, only, json));
        } catch (const std::exception& e) {
            spdlog::error("usecases: {}", e.what());
            set_exit_code(1);
        }
    });
}

}  // namespace mpsteer::cli
