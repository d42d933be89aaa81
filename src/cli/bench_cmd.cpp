// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer bench: per-packet cost of chains, measured with BPF_PROG_TEST_RUN in one run beside a
// bare XDP_PASS program and a parse-only program (ratios survive noisy machines).
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "datapath/datapath.h"
#include "datapath/frames.h"
#include "lb/balancer.h"
#include "net/stats.h"

namespace mpsteer::cli {
namespace {
using namespace mpsteer::datapath;
using net::median;

// The selectors a chain is made of, in order; all match the canned frame unless `miss`.
std::vector<mps_step> selectors(bool miss) {
    std::vector<mps_step> v;
    v.push_back(cidr4_step(MPS_W_DST, miss ? "10.9.0.0" : "10.0.1.0", 24));
    v.push_back(port_match(PortDir::dst, 5201, 5201).step(0));
    v.push_back(kinds_match(MPS_K_DSS).step(0));
    v.push_back(cidr4_step(MPS_W_SRC, "10.0.1.0", 24));
    uint32_t a[4] = {}, b[4] = {};
    inet_pton(AF_INET, "10.0.1.1", &a[0]);
    inet_pton(AF_INET, "10.0.1.2", &b[0]);
    v.push_back(Match(4, true).prefix(MPS_W_SRC, a, 32).prefix(MPS_W_DST, b, 32).step(0));
    v.push_back(cidr4_step(MPS_W_DST, "10.0.0.0", 16));
    v.push_back(port_match(PortDir::src, 1024, 65535).step(0));
    return v;
}

// n steps: n-1 selectors chained on match, then the pass actor.
ChainSet chain(size_t n, bool miss) {
    ChainSet c;
    auto sel = selectors(miss);
    for (size_t i = 0; i + 1 < n; ++i) {
        auto s = sel[i % sel.size()];
        s.on_match = static_cast<uint16_t>(i + 1);
        c.steps.push_back(s);
    }
    c.steps.push_back(make_step(MPS_ACT_PASS, MPS_PC_END));
    c.entries.push_back({Hook::xdp, "", 0});
    c.policies.push_back("bench");
    return c;
}

// The 4-step chain of the table-fill cases: three selectors, then record, which reads and
// writes the packet's flow entry (what every stateful step pays for a flow lookup).
ChainSet stateful_chain() {
    ChainSet c;
    auto sel = selectors(false);
    for (size_t i = 0; i < 3; ++i) {
        auto s = sel[i];
        s.on_match = static_cast<uint16_t>(i + 1);
        c.steps.push_back(s);
    }
    c.steps.push_back(make_step(MPS_ACT_RECORD, MPS_PC_END));
    c.entries.push_back({Hook::xdp, "", 0});
    c.policies.push_back("bench");
    return c;
}

// `n` flows of other 4-tuples (10.128.0.0/9 to one server port) in the flow table.
void fill_flows(const StateMaps& state, uint32_t n) {
    constexpr uint32_t kBatch = 65536;
    std::vector<mps_flow_key> keys;
    std::vector<mps_flow> values(kBatch);
    for (uint32_t i = 0; i < n;) {
        keys.clear();
        for (; i < n && keys.size() < kBatch; ++i) {
            mps_flow_key k{};
            k.family = 4;
            k.a[0] = htonl(0x0a800000u | (i >> 4));
            k.b[0] = htonl(0x0a000102u);
            k.port_a = uint16_t(40000 + (i & 15));
            k.port_b = 5201;
            keys.push_back(k);
        }
        uint32_t count = keys.size();
        if (bpf_map_update_batch(state.flows(), keys.data(), values.data(), &count, nullptr))
            throw Error("filling the flow table: " + std::string(std::strerror(errno)));
    }
}

struct Case {
    std::string key;
    std::unique_ptr<Generation> gen;
    int fd;
    std::vector<double> samples;
    std::vector<uint8_t> frame;  // empty: the chains' data segment
    uint32_t verdict = 2;        // XDP_PASS
};

// The balancer (bpf/lb.bpf.c) with a VIP, three backends (on the interface the frames come in
// by: XDP_TX) and one token, and the frames of its three paths: a new connection's SYN, a
// data segment of a subflow it follows (the SYN made its entry), a join with a known token.
struct BalancerCase {
    lb::Balancer balancer{lb::Sizes{65536, 65536, lb::kDefaultTableSize}};
    static constexpr uint32_t kVip = 0xcb00710a;  // 203.0.113.10
    static constexpr uint32_t kToken = 0x01020304;
    BalancerCase() {
        lb::Service vip;
        const uint32_t be = htonl(kVip);
        std::memcpy(vip.addr.data(), &be, 4);
        vip.port = 443;
        balancer.set_services({vip});
        std::vector<lb::Target> targets;
        for (const char* name : {"b1", "b2", "b3"}) {
            lb::Target t;
            t.backend.name = name;
            t.ifindex = 1;  // BPF_PROG_TEST_RUN's frames come in by lo
            targets.push_back(t);
        }
        balancer.set_backends(targets);
        balancer.own_token(kToken, balancer.index_of("b2"));
    }
    static FrameSpec spec(uint16_t sport) {
        FrameSpec f;
        f.daddr = kVip;
        f.sport = sport;
        f.dport = 443;
        return f;
    }
    static std::vector<uint8_t> syn(uint16_t sport = 40000, uint32_t saddr = FrameSpec{}.saddr) {
        auto s = spec(sport);
        s.saddr = saddr;
        s.payload = 0;
        return tcp_frame(s, 0x02, {2, 4, 0x05, 0xb4, 30, 4, 0x01, 0x01});  // MSS, MP_CAPABLE
    }
    // What a connection's first SYN costs over one the balancer knows (its entry written into
    // lb_flows). BPF_PROG_TEST_RUN repeats one frame, so a new SYN is one run of a frame never
    // seen, against one run of the known SYN, alternating; the kernel times each run itself
    // (no system call in the figure, but its clock reads: the same on both sides).
    struct NewSynCost {
        double new_ns, known_ns;
    };
    NewSynCost new_syn_cost(int samples) {
        std::vector<double> fresh, known;
        const auto seen = syn();
        for (int i = 0; i < samples; ++i) {
            const auto f = syn(uint16_t(1024 + i % 60000), 0x0a000001 + uint32_t(i / 60000) + 1);
            fresh.push_back(test_run(balancer.prog_fd(), f, true, 1).duration_ns);
            known.push_back(test_run(balancer.prog_fd(), seen, true, 1).duration_ns);
        }
        return {median(fresh), median(known)};
    }
    static std::vector<uint8_t> data() { return mptcp_data_frame(spec(40000)); }
    static std::vector<uint8_t> join() {
        auto s = spec(40001);
        s.payload = 0;
        return tcp_frame(s, 0x02, {30, 12, 0x10, 1, 1, 2, 3, 4, 9, 9, 9, 9});  // MP_JOIN
    }
};

int run_bench(bool json, uint32_t repeat, int rounds) {
    init_libbpf_logging();
    const std::string root = "/sys/fs/bpf/mpsteer-bench-" + std::to_string(getpid());
    struct Cleanup {
        std::string root;
        ~Cleanup() { std::filesystem::remove_all(root); }
    } cleanup{root};
    // The smallest tables for the chains that keep no state: every generation below loads a
    // datapath whose own tables are sized by these (a 32-bit kernel has little room).
    TableSizes small;
    small.flows = TableSizes::kMinFlows;
    auto state = StateMaps::open(root, small);
    auto frame = mptcp_data_frame();

    std::vector<Case> cases;
    auto base = Generation::build(
        chain(2, false), 1, state,
        {"bench_bare_pass", "bench_parse_only", "bench_flow_key", "bench_flow_lookup",
         "bench_flow_cache_hit", "bench_floor_match", "bench_floor_nomatch"});
    for (auto [key, prog] : {std::pair{"bare_pass_ns", "bench_bare_pass"},
                             {"parse_only_ns", "bench_parse_only"},
                             {"flow_key_ns", "bench_flow_key"},
                             {"flow_lookup_ns", "bench_flow_lookup"},
                             {"flow_cache_hit_ns", "bench_flow_cache_hit"},
                             {"floor_match_ns", "bench_floor_match"},
                             {"floor_nomatch_ns", "bench_floor_nomatch"}})
        cases.push_back({key, nullptr, base->prog_fd(prog), {}, {}, 2});
    // A kernel that refuses the compiled entries runs every chain in the entry program: the
    // compiled cases are then reported as refused, with the kernel's reason, not measured.
    std::string refused;
    auto add_compiled = [&](const char* key, std::unique_ptr<Generation> g) {
        if (!g->compiled(Hook::xdp)) {
            refused = g->refusal(Hook::xdp);
            if (refused.empty()) throw Error(std::string(key) + ": chain not compiled");
            return;
        }
        int fd = g->entry_fd(Hook::xdp);
        cases.push_back({key, std::move(g), fd, {}, {}, 2});
    };
    for (auto [key, n, miss] :
         {std::tuple{"chain2_match_ns", 2, false}, std::tuple{"chain4_match_ns", 4, false},
          std::tuple{"chain8_match_ns", 8, false}, std::tuple{"chain4_nomatch_ns", 4, true}}) {
        add_compiled(key, Generation::build(chain(n, miss), 2, state));
    }
    // The same chains through the entry program's interpreter (what runs chains that are
    // not compiled, and every packet a compiled entry hands on).
    for (auto [key, n, miss] : {std::tuple{"chain4_match_interp_ns", 4, false},
                                std::tuple{"chain4_nomatch_interp_ns", 4, true}}) {
        auto g = Generation::build(chain(n, miss), 3, state);
        int fd = g->datapath()->entry_fd(Hook::xdp);
        cases.push_back({key, std::move(g), fd, {}, {}, 2});
    }
    // The same stateful chain with the flow table holding 1 k, 64 k and 1 M other flows, each
    // table twice the size it holds (as an agent sized for its load would run).
    // A kernel that cannot allocate tables that large (a 32-bit kernel's vmalloc area is a
    // few hundred MB) skips that case and says so.
    std::vector<std::pair<std::string, StateMaps>> filled;  // (1k, 64k, 1m) and its tables
    filled.reserve(3);
    nlohmann::ordered_json skipped;
    for (auto [size, n] : {std::pair{"1k", 1u << 10}, {"64k", 1u << 16}, {"1m", 1u << 20}}) {
        const std::string key = std::string("chain4_flows") + size + "_ns";
        TableSizes sizes;
        sizes.flows = std::max(2 * n, TableSizes::kMinFlows);
        try {
            auto tables = StateMaps::open(root + "/" + key, sizes);
            fill_flows(tables, n);
            auto g = Generation::build(stateful_chain(), 4, tables);
            filled.emplace_back(size, std::move(tables));
            add_compiled(key.c_str(), std::move(g));
        } catch (const Error& e) {
            skipped[key] =
                std::string(e.what()) + " (tables for " + std::to_string(sizes.flows) + " flows)";
        }
    }
    // A kernel that refuses the balancer skips its cases and says why.
    std::unique_ptr<BalancerCase> lbc;
    try {
        lbc = std::make_unique<BalancerCase>();
    } catch (const std::exception& e) {
        for (const char* k : {"lb_syn_ns", "lb_data_ns", "lb_join_ns"}) skipped[k] = e.what();
    }
    if (lbc) {
        const int fd = lbc->balancer.prog_fd();
        cases.push_back({"lb_syn_ns", nullptr, fd, {}, BalancerCase::syn(), 3});
        cases.push_back({"lb_data_ns", nullptr, fd, {}, BalancerCase::data(), 3});
        cases.push_back({"lb_join_ns", nullptr, fd, {}, BalancerCase::join(), 3});
    }
    for (auto& c : cases)
        if (c.frame.empty()) c.frame = frame;
    // Sanity: every case must actually run to its verdict on its frame (the chains pass, the
    // balancer sends back out).
    for (auto& c : cases) {
        auto r = test_run(c.fd, c.frame, true, 1);
        if (r.retval != c.verdict)
            throw Error(c.key + ": unexpected verdict " + std::to_string(r.retval));
        if (c.key.starts_with("chain4_flows") && c.gen->step_counters().at(3).matched != 1)
            throw Error(c.key + ": record did not reach the flow table");
    }
    // Everything is loaded and held by descriptors: drop the pins now, so an interrupted
    // run (the measuring is most of it) leaves nothing in bpffs.
    std::filesystem::remove_all(root);
    // Interleave the cases round by round so drift hits them all alike; report medians.
    for (int round = 0; round < rounds; ++round)
        for (auto& c : cases)
            c.samples.push_back(test_run(c.fd, c.frame, true, repeat).duration_ns);
    nlohmann::ordered_json out;
    for (auto& c : cases) out[c.key] = median(c.samples);
    // Ratios and differences per round (both figures from the same round), then their median:
    // a round that another task disturbed moves both sides. Left out when a case was not
    // measured (compiled entries refused).
    auto per_round = [&](const std::string& key, const std::string& x, const std::string& y,
                         auto op) {
        auto find = [&](const std::string& k) {
            return std::find_if(cases.begin(), cases.end(), [&](auto& c) { return c.key == k; });
        };
        auto a = find(x), b = find(y);
        if (a == cases.end() || b == cases.end()) return;
        std::vector<double> r;
        for (size_t i = 0; i < a->samples.size(); ++i)
            r.push_back(op(a->samples[i], b->samples[i]));
        out[key] = median(r);
    };
    auto ratio_of = [&](const std::string& key, const std::string& num, const std::string& den) {
        per_round(key, num, den, [](double a, double b) { return a / b; });
    };
    auto extra_of = [&](const std::string& key, const std::string& more, const std::string& less) {
        per_round(key, more, less, [](double a, double b) { return a - b; });
    };
    ratio_of("chain4_match_ratio", "chain4_match_ns", "bare_pass_ns");
    ratio_of("chain4_nomatch_ratio", "chain4_nomatch_ns", "bare_pass_ns");
    // The least the two chains' selectors need (hand-written, bench_floor_*), and what the
    // compiled entries cost over it.
    ratio_of("floor_match_ratio", "floor_match_ns", "bare_pass_ns");
    ratio_of("floor_nomatch_ratio", "floor_nomatch_ns", "bare_pass_ns");
    ratio_of("chain4_match_vs_floor_ratio", "chain4_match_ns", "floor_match_ns");
    ratio_of("chain4_nomatch_vs_floor_ratio", "chain4_nomatch_ns", "floor_nomatch_ns");
    ratio_of("chain4_match_interp_ratio", "chain4_match_interp_ns", "bare_pass_ns");
    ratio_of("chain4_nomatch_interp_ratio", "chain4_nomatch_interp_ns", "bare_pass_ns");
    ratio_of("flows1m_vs_1k_ratio", "chain4_flows1m_ns", "chain4_flows1k_ns");
    ratio_of("flows64k_vs_1k_ratio", "chain4_flows64k_ns", "chain4_flows1k_ns");
    for (const char* k : {"lb_syn", "lb_data", "lb_join"})
        ratio_of(std::string(k) + "_ratio", std::string(k) + "_ns", "bare_pass_ns");
    // record's cost taken apart: the step as a whole (the same chain ending in pass instead),
    // parsing the packet and building its flow key, looking that key up in the flow table, and
    // what a per-CPU last-flow cache's hit would cost instead of the lookup.
    extra_of("record_step_extra_ns", "chain4_flows1k_ns", "chain4_match_ns");
    extra_of("flow_key_extra_ns", "flow_key_ns", "bare_pass_ns");
    extra_of("flow_lookup_extra_ns", "flow_lookup_ns", "flow_key_ns");
    extra_of("flow_cache_hit_extra_ns", "flow_cache_hit_ns", "flow_key_ns");
    if (lbc) {
        // 20,000 new connections: a third of the flow table, so no eviction in the figure.
        const auto cost = lbc->new_syn_cost(20000);
        out["lb_new_syn_single_run_ns"] = cost.new_ns;
        out["lb_known_syn_single_run_ns"] = cost.known_ns;
        out["lb_new_syn_extra_ns"] = cost.new_ns - cost.known_ns;
        const auto counts = lbc->balancer.counters();
        if (counts[MPS_LB_C_JOINS_UNKNOWN] || counts[MPS_LB_C_NO_BACKEND])
            throw Error("lb cases: a join found no token or a packet no backend");
    }
    if (!refused.empty()) out["compiled_entries_refused"] = refused;
    if (!skipped.empty()) out["cases_skipped"] = skipped;
    // What the agent's count of its tables (every 10 s, for the metrics) costs as they fill.
    for (auto& [size, tables] : filled) {
        std::vector<double> walks;
        for (int i = 0; i < 3; ++i) {
            auto t0 = std::chrono::steady_clock::now();
            tables.tables(true);
            walks.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
        }
        out["table_count_flows" + size + "_ms"] = median(walks);
    }
    out["repeat"] = repeat;
    out["rounds"] = rounds;
    out["frame_bytes"] = frame.size();
    if (json) {
        std::cout << out.dump() << '\n';
    } else {
        for (auto& [k, v] : out.items()) std::cout << k << ": " << v << '\n';
        if (!refused.empty())
            std::cout << "compiled entries: refused by this kernel, chains run in the entry "
                         "program (the *_interp cases); the compiled cases were not measured\n";
        std::cout << "targets: chain4_match_ratio <= 1.3, chain4_nomatch_ratio <= 1.1, "
                     "flows1m_vs_1k_ratio <= 1.15\n";
    }
    return 0;
}
}  // namespace

void add_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "Measure per-packet cost of chains (needs root)");
    static bool json = false, live = false;
    static uint32_t repeat = 100000;
    static int rounds = 31;
    cmd->add_flag("--json", json, "print one JSON object");
    // main() hands `bench --live` to mpsteer-lab before this parser sees it.
    cmd->add_flag("--live", live,
                  "a real MPTCP transfer through the lab instead: no program, a bare XDP_PASS "
                  "and chains on both hosts, the agent with the shipped policies, in "
                  "alternating rounds (the test bed, mpsteer-lab: its options in `mpsteer bench "
                  "--live --help`)");
    cmd->add_option("--repeat", repeat, "BPF_PROG_TEST_RUN repetitions per sample")
        ->check(CLI::Range(100000u, 100000000u))
        ->capture_default_str();
    cmd->add_option(
           "--rounds", rounds,
           "samples per case, interleaved (medians reported; ratios: median of the per-round ratios)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    cmd->callback([] {
        try {
            set_exit_code(run_bench(json, repeat, rounds));
        } catch (const std::exception& e) {
            spdlog::error("bench: {}", e.what());
            set_exit_code(1);
        }
    });
}

}  // namespace mpsteer::cli
