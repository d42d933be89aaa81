// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Use case "joins routed by token": backends without an address of their own behind one
// balancer. The kernel behind an ECMP route against mpsteer's balancer (bpf/lb.bpf.c) on the
// same router: connections before and after a fourth backend is added, after one is drained
// (the ECMP route can only remove it), and forged joins with random tokens.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <spdlog/spdlog.h>
#include <thread>

#include "lab/lab.h"
#include "lab/token_balancer.h"
#include "net/stats.h"
#include "testbed/usecases.h"

namespace mpsteer::cli::usecases {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;

constexpr uint16_t kPort = 443;
// Connections per run: before the fourth backend, after it, after backend 1 is drained.
// 2,000 after the add: the spread of that many over 4 backends is about 4 % (one sigma).
constexpr unsigned kBefore = 500, kAfter = 2000, kDrained = 200, kForged = 1000;
constexpr int kBackends = 4;

struct TokenTally {
    unsigned connections = 0, joined = 0, resets = 0, fallbacks = 0;
    // Resets the backends sent while only existing connections talked, after the fourth
    // backend came and after the drain: their segments reached a backend without them.
    uint64_t rsts_after_add = 0, rsts_after_drain = 0;
    unsigned to_drained = 0;                      // new connections on backend 1 after its drain
    std::array<unsigned, kBackends> after_add{};  // new connections per backend after the add
    uint64_t joins_received = 0, joins_no_token = 0, forged_received = 0;
    uint64_t joins_unknown = 0, joins_routed = 0;  // the balancer's counters (mpsteer only)
    unsigned runs_cut_short = 0;                   // a connect failed: the run counts nothing
    std::vector<double> stream_gbps;               // one bulk stream through the router per run

    TokenTally& operator+=(const TokenTally& o) {
        connections += o.connections;
        joined += o.joined;
        resets += o.resets;
        fallbacks += o.fallbacks;
        rsts_after_add += o.rsts_after_add;
        rsts_after_drain += o.rsts_after_drain;
        to_drained += o.to_drained;
        for (int b = 0; b < kBackends; ++b) after_add[b] += o.after_add[b];
        joins_received += o.joins_received;
        joins_no_token += o.joins_no_token;
        forged_received += o.forged_received;
        joins_unknown += o.joins_unknown;
        joins_routed += o.joins_routed;
        runs_cut_short += o.runs_cut_short;
        stream_gbps.insert(stream_gbps.end(), o.stream_gbps.begin(), o.stream_gbps.end());
        return *this;
    }
    // The largest deviation of a backend's share of the new connections from an equal one.
    double spread() const {
        unsigned n = 0;
        for (unsigned v : after_add) n += v;
        if (!n) return 1;
        double worst = 0;
        for (unsigned v : after_add)
            worst = std::max(worst, std::fabs(double(v) * kBackends / n - 1));
        return worst;
    }
};

uint64_t mib_sum(const LoadBalancerLab& lab, const char* name, bool tcp = false) {
    uint64_t n = 0;
    for (int b = 1; b <= lab.backends(); ++b) {
        const auto c = tcp ? tcp_counters(lab.backend_ns(b)) : mptcp_counters(lab.backend_ns(b));
        auto it = c.find(name);
        if (it == c.end()) throw Error(std::string("this kernel has no MPTcpExt ") + name);
        n += it->second;
    }
    return n;
}

// The router's ECMP route to the VIP over backends 1..n but those in `without`.
void ecmp_route(const LoadBalancerLab& lab, int family, int n, int without = 0) {
    const std::string v = family == 6 ? "-6" : "-4", host = family == 6 ? "/128" : "/32";
    std::vector<std::string> cmd{
        "ip", "-n", lab.router_ns(), v, "route", "replace", LoadBalancerLab::vip(family) + host};
    for (int b = 1; b <= n; ++b) {
        if (b == without) continue;
        const std::string via = family == 6 ? "fd00:1:" + std::to_string(b) + "::2"
                                            : "10.1." + std::to_string(b) + ".2";
        cmd.insert(cmd.end(), {"nexthop", "via", via, "dev", lab.router_backend_if(b)});
    }
    must(cmd);
}

std::array<unsigned, kBackends> accepted(const std::vector<std::unique_ptr<Discard>>& servers) {
    std::array<unsigned, kBackends> a{};
    for (int b = 0; b < kBackends; ++b) a[b] = servers[b]->accepted();
    return a;
}

void exchange(std::vector<ConnectionSet*> sets, int ticks) {
    for (int t = 0; t < ticks; ++t) {
        check_stop();
        for (auto* s : sets) s->send_each(1024);
        std::this_thread::sleep_for(100ms);
    }
}

TokenTally token_run(const std::string& tag, int family, bool with_mpsteer, int round) {
    // A lab of its own per run: what the last run's connections still send as they close
    // (retransmissions to backends that never had them, once its routing changed) must not
    // count in this one.
    LoadBalancerLab lab(tag + std::to_string(family) + (with_mpsteer ? "m" : "k"), kBackends,
                        false);
    std::unique_ptr<TokenBalancer> tb;
    if (with_mpsteer)
        tb = std::make_unique<TokenBalancer>(lab, kPort, 3, MPS_LB_UNKNOWN_DROP);
    else
        ecmp_route(lab, family, 3);
    std::vector<std::unique_ptr<Discard>> servers;
    for (int b = 1; b <= kBackends; ++b)
        servers.push_back(std::make_unique<Discard>(lab.backend_ns(b), kPort, family == 6));
    const uint64_t syn_rx0 = mib_sum(lab, "MPJoinSynRx");
    const uint64_t no_token0 = mib_sum(lab, "MPJoinNoTokenFound");
    const auto c0 = tb ? tb->counters() : lb::Counters{};
    const std::string vip = LoadBalancerLab::vip(family);
    TokenTally t;

    // What the router forwards at most: one bulk MPTCP stream to the VIP (both subflows through
    // the router; CPU-bound on veths), plain forwarding against the balancer.
    const TrafficStats bulk = send_stream(lab.client_ns(), vip, kPort, SendOptions::of_time(3s));
    t.stream_gbps.push_back(bulk.seconds > 0 ? bulk.bytes * 8 / bulk.seconds / 1e9 : 0);

    ConnectionSet before(lab.client_ns(), vip, kPort, kBefore);
    exchange({&before}, 10);
    // A fourth backend: the balancer's table gives it a quarter of the slots; the ECMP route
    // rehashes.
    if (tb)
        tb->set_backends(4);
    else
        ecmp_route(lab, family, 4);
    uint64_t rsts = mib_sum(lab, "OutRsts", true);
    exchange({&before}, 10);
    t.rsts_after_add = mib_sum(lab, "OutRsts", true) - rsts;
    const auto a0 = accepted(servers);
    ConnectionSet after(lab.client_ns(), vip, kPort, kAfter);
    exchange({&before, &after}, 10);
    const auto a1 = accepted(servers);
    for (int b = 0; b < kBackends; ++b) t.after_add[b] = a1[b] - a0[b];
    // Backend 1 drained: the balancer gives it no new connection and keeps its own going; the
    // ECMP route can only take it out.
    if (tb)
        tb->set_backends(4, {1});
    else
        ecmp_route(lab, family, 4, 1);
    rsts = mib_sum(lab, "OutRsts", true);
    exchange({&before, &after}, 10);
    t.rsts_after_drain = mib_sum(lab, "OutRsts", true) - rsts;
    ConnectionSet drained(lab.client_ns(), vip, kPort, kDrained);
    exchange({&before, &after, &drained}, 10);
    t.to_drained = accepted(servers)[0] - a1[0];
    for (ConnectionSet* set : {&before, &after, &drained})
        for (const auto& st : set->states()) {
            t.connections++;
            t.joined += st.subflows >= 1;
            t.resets += st.error || st.closed;
            t.fallbacks += st.fallback;
        }
    std::this_thread::sleep_for(200ms);
    t.joins_received = mib_sum(lab, "MPJoinSynRx") - syn_rx0;
    t.joins_no_token = mib_sum(lab, "MPJoinNoTokenFound") - no_token0;

    // Joins with random tokens, from a port no connection uses.
    std::mt19937 rng(static_cast<unsigned>(round * 2 + family));
    const uint64_t forged0 = mib_sum(lab, "MPJoinSynRx");
    for (unsigned i = 0; i < kForged; ++i)
        send_join_syn(lab.client_ns(), family, LoadBalancerLab::client_addr(1, family),
                      static_cast<uint16_t>(20000 + i), vip, kPort, rng());
    std::this_thread::sleep_for(1s);  // neighbour discovery, then the backends' counters
    t.forged_received = mib_sum(lab, "MPJoinSynRx") - forged0;
    if (tb) {
        const auto c = tb->counters();
        t.joins_unknown = c[MPS_LB_C_JOINS_UNKNOWN] - c0[MPS_LB_C_JOINS_UNKNOWN];
        t.joins_routed = c[MPS_LB_C_JOINS_ROUTED] - c0[MPS_LB_C_JOINS_ROUTED];
    }
    spdlog::info(
        "lb-token round {} IPv{} {}: {} connections, {} joined, {} reset, joins {} received, {} "
        "without token; backends' resets after the add {}, after the drain {}; new connections "
        "after the add {}/{}/{}/{}; forged joins at the backends {}",
        round + 1, family, with_mpsteer ? "mpsteer" : "kernel", t.connections, t.joined, t.resets,
        t.joins_received, t.joins_no_token, t.rsts_after_add, t.rsts_after_drain, t.after_add[0],
        t.after_add[1], t.after_add[2], t.after_add[3], t.forged_received);
    return t;
}

}  // namespace

Report token_balancer(const Options& opt) {
    Report r;
    r.name = "lb-token";
    r.title = "joins routed by token";
    r.setup =
        "3 backends (then a 4th, then backend 1 drained) hold the VIP and no address of their "
        "own; the client opens " +
        std::to_string(kBefore) + " + " + std::to_string(kAfter) + " + " +
        std::to_string(kDrained) +
        " MPTCP connections per run, its path manager joining from its second address to the "
        "VIP, then sends " +
        std::to_string(kForged) +
        " joins with random tokens; kernel: an ECMP route hashing the 5-tuple; mpsteer: the "
        "balancer at XDP on the router (Maglev, tokens from third ACKs, L2 direct server return)";
    // 2,700 connections and their subflows at once.
    rlimit nofile{16384, 16384};
    setrlimit(RLIMIT_NOFILE, &nofile);
    const std::string tag = "t" + std::to_string(getpid() % 10000);
    TokenTally sum[2][2];  // [IPv4, IPv6][kernel, mpsteer]
    for (int round = 0; round < opt.rounds; round++)
        for (int f = 0; f < 2; f++)
            for (int m : {round % 2, 1 - round % 2}) try {
                    sum[f][m] += token_run(tag, f ? 6 : 4, m == 1, round);
                } catch (const Error& e) {
                    // Behind ECMP a connect now and then meets a reset; that ends the run.
                    if (m == 1) throw;
                    spdlog::warn("lb-token round {} IPv{} kernel: cut short: {}", round + 1,
                                 f ? 6 : 4, e.what());
                    sum[f][m].runs_cut_short++;
                }

    const std::vector<FamilyFigure<TokenTally>> specs = {
        {"connections", "connections", "",
         [](const TokenTally& t, bool) { return count_cell(t.connections); }},
        {"joined", "connections with >= 2 subflows", ">= 99.9 %",
         [](const TokenTally& t, bool mpsteer) {
             Cell c{t.joined, percent(t.joined, t.connections), {}};
             if (mpsteer) c.met = t.connections && t.joined * 1000 >= t.connections * 999;
             return c;
         }},
        {"joins_received", "MP_JOIN SYNs at the backends (MIB)", "",
         [](const TokenTally& t, bool) { return count_cell(t.joins_received); }},
        {"joins_no_token", "joins failed: no token (MIB MPJoinNoTokenFound)", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.joins_no_token, m); }},
        {"rsts_after_add",
         "resets from backends that got an existing connection's segment, after the 4th came", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.rsts_after_add, m); }},
        {"spread_after_add", "new connections per backend after the add (largest deviation)",
         "<= 10 %",
         [](const TokenTally& t, bool mpsteer) {
             std::string text;
             for (unsigned v : t.after_add) text += (text.empty() ? "" : "/") + std::to_string(v);
             Cell c{nlohmann::ordered_json{{"per_backend", t.after_add}, {"deviation", t.spread()}},
                    text + " (" + fixed(100 * t.spread(), 1) + " %)",
                    {}};
             if (mpsteer) c.met = t.spread() <= 0.10;
             return c;
         }},
        {"to_drained", "new connections to the drained backend", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.to_drained, m); }},
        {"rsts_after_drain", "... after the drain", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.rsts_after_drain, m); }},
        {"resets", "connections reset (in all)", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.resets, m); }},
        {"fallbacks", "connections fallen back to TCP", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.fallbacks, m); }},
        {"forged_received", "forged joins (random tokens) that reached a backend", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.forged_received, m); }},
        {"joins_unknown", "joins the balancer found no token for (forged ones included)", "",
         [](const TokenTally& t, bool) { return count_cell(t.joins_unknown); }},
        {"runs_cut_short", "runs ended by a connect that was reset (not counted above)", "0",
         [](const TokenTally& t, bool m) { return zero_cell(t.runs_cut_short, m); }},
        {"stream_gbps", "one bulk MPTCP stream to the VIP, median of the runs, Gbit/s", "",
         [](const TokenTally& t, bool) {
             const double g = t.stream_gbps.empty() ? 0 : net::median(t.stream_gbps);
             return Cell{g, fixed(g, 2), std::nullopt};
         }},
    };
    add_family_figures(r, specs, sum);
    return r;
}

}  // namespace mpsteer::cli::usecases
