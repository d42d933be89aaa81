// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Use case "servers behind a stateless load balancer" (Duchene & Bonaventure, ICNP 2017):
// backends behind an ECMP route hashing the 5-tuple, with policies/lb-unique-address.yaml and
// policies/mp-join-guard.yaml on every backend, against the kernel alone.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <spdlog/spdlog.h>
#include <thread>

#include "testbed/agent_process.h"
#include "cli/commands.h"
#include "testbed/usecases.h"
#include "lab/lab.h"

namespace mpsteer::cli::usecases {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;

constexpr uint16_t kServicePort = 443;  // the port the shipped lb-vip-service selector names

// The shipped policies that belong on a backend, for one backend of the lab: the VIP and
// unique address they name become the lab's.
std::unique_ptr<AdaptedShare> backend_policies(const std::string& share, const std::string& dir,
                                               int backend, int family) {
    const std::string host = family == 6 ? "/128" : "/32";
    return std::make_unique<AdaptedShare>(
        share, dir,
        std::vector<std::pair<std::string, AdaptedShare::Replacements>>{
            {"policies/shared/lb-vip.yaml",
             {{"203.0.113.10/32", LoadBalancerLab::vip(family) + host}}},
            {"policies/lb-unique-address.yaml", {}},
            {"policies/mp-join-guard.yaml",
             {{"198.51.100.20/32", LoadBalancerLab::unique_addr(backend, family) + host}}},
        });
}

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
    for (int b = 1; b <= lab.backends(); b++) {
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
    std::vector<std::unique_ptr<AdaptedShare>> policies;
    std::vector<std::unique_ptr<ShippedAgent>> agents;
    if (with_mpsteer) {
        for (int b = 1; b <= lab.backends(); b++) {
            const std::string name = "uc-" + tag + "-b" + std::to_string(b);
            policies.push_back(
                backend_policies(opt.share, "/run/mpsteer-" + name + "-share", b, family));
            agents.push_back(
                std::make_unique<ShippedAgent>(policies.back()->share(), lab.backend_ns(b), name));
        }
        for (auto& a : agents) a->wait_ready();
    }
    std::vector<std::unique_ptr<Discard>> servers;
    for (int b = 1; b <= lab.backends(); b++)
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
            for (int b = 1; b <= lab.backends(); b++) {
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
    spdlog::info(
        "lb round {} IPv{} {}: {} connections, {} with an extra subflow, {} joins "
        "received, {} failed, {} resets, VIP subflows {} ({} backup), {} to unique "
        "addresses",
        round + 1, family, with_mpsteer ? "mpsteer" : "kernel", t.connections, t.with_extra_subflow,
        t.joins_received, t.joins_failed, t.resets, t.vip_subflows, t.vip_subflows_backup,
        t.unique_subflows);
    return t;
}

}  // namespace

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

    const std::vector<FamilyFigure<LbTally>> specs = {
        {"connections", "connections", "",
         [](const LbTally& t, bool) { return count_cell(t.connections); }},
        {"with_extra_subflow", "connections with >= 2 subflows", "100 %",
         [](const LbTally& t, bool mpsteer) {
             Cell c{t.with_extra_subflow, percent(t.with_extra_subflow, t.connections), {}};
             if (mpsteer) c.met = t.connections && t.with_extra_subflow == t.connections;
             return c;
         }},
        {"joins_received", "MP_JOIN SYNs at the backends (MIB)", "",
         [](const LbTally& t, bool) { return count_cell(t.joins_received); }},
        {"joins_failed", "joins failed: no token (MIB)", "0",
         [](const LbTally& t, bool m) { return zero_cell(t.joins_failed, m); }},
        {"unique_address_subflows", "subflows to a unique address (either family)", "",
         [](const LbTally& t, bool) { return count_cell(t.unique_subflows); }},
        {"resets", "connections reset", "0",
         [](const LbTally& t, bool m) { return zero_cell(t.resets, m); }},
        {"fallbacks", "connections fallen back to TCP", "0",
         [](const LbTally& t, bool m) { return zero_cell(t.fallbacks, m); }},
        {"vip_subflow_backup", "VIP subflow backup", "yes",
         [](const LbTally& t, bool mpsteer) {
             const bool all = t.vip_subflows && t.vip_subflows_backup == t.vip_subflows;
             Cell c{nlohmann::ordered_json{{"subflows", t.vip_subflows},
                                           {"backup", t.vip_subflows_backup}},
                    std::string(all                     ? "yes"
                                : t.vip_subflows_backup ? "partly"
                                                        : "no") +
                        " (" + std::to_string(t.vip_subflows_backup) + "/" +
                        std::to_string(t.vip_subflows) + ")",
                    {}};
             if (mpsteer) c.met = all;
             return c;
         }},
    };
    add_family_figures(r, specs, sum);
    return r;
}

}  // namespace mpsteer::cli::usecases
