// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Chain semantics: AND / OR / NOT from the branch targets, policies tried in priority order,
// the longest chain, chains cut for length, a missing prog_array slot, per-interface entries
// and the two generation slots.
#include <catch2/catch.hpp>

#include <bpf/bpf.h>
#include <net/if.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "bpf_env.h"

using namespace mpsteer::test;

namespace {

const std::vector<Hook> kAllHooks = {Hook::xdp, Hook::tc_egress, Hook::tc_ingress};

struct ChainCase {
    std::string name;
    Packet pkt;
    Verdict verdict;
    std::vector<uint64_t> runs;  // expected visits per step (counters: counted steps only)
};

void run_chain_cases(const std::vector<mps_step>& steps, const std::vector<ChainCase>& t) {
    Env env(chain_of(steps));
    for (const auto& c : t) {
        Bytes in = c.pkt.build();
        for (Hook h : kAllHooks) {
            INFO(c.name << " via " << name_of(h));
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(c.verdict, h));
            if (r.out != in) FAIL_CHECK("frame modified\n" << describe_frame(r.out, in));
            for (size_t pc = 0; pc < steps.size(); pc++) {
                CAPTURE(pc);
                CHECK(step_delta(before, after, pc).runs ==
                      (counted(steps[pc]) ? c.runs.at(pc) : 0));
            }
            CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
            CHECK(gen_delta(before, after, MPS_GC_CHAIN_TOO_LONG) == 0);
        }
    }
}

Packet pk(const char* src, const char* dst, uint16_t dport = 80) {
    return Packet::v4(src, 40000, dst, dport).payload(4);
}

}  // namespace

TEST_CASE("chain: AND (match -> next selector, miss -> end)", "[bpf][chain]") {
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", 1, END), sel_dst("10.2.0.0/16", 2, END),
                               step(MPS_ACT_DROP)};
    run_chain_cases(s, {
                           {"both", pk("10.1.0.1", "10.2.0.1"), Verdict::drop, {1, 1, 1}},
                           {"first only", pk("10.1.0.1", "10.3.0.1"), Verdict::pass, {1, 1, 0}},
                           {"second only", pk("10.9.0.1", "10.2.0.1"), Verdict::pass, {1, 0, 0}},
                           {"neither", pk("10.9.0.1", "10.3.0.1"), Verdict::pass, {1, 0, 0}},
                       });
}

TEST_CASE("chain: OR (match -> action, miss -> next selector)", "[bpf][chain]") {
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", 2, 1), sel_dst("10.2.0.0/16", 2, END),
                               step(MPS_ACT_DROP)};
    run_chain_cases(s, {
                           {"both", pk("10.1.0.1", "10.2.0.1"), Verdict::drop, {1, 0, 1}},
                           {"first only", pk("10.1.0.1", "10.3.0.1"), Verdict::drop, {1, 0, 1}},
                           {"second only", pk("10.9.0.1", "10.2.0.1"), Verdict::drop, {1, 1, 1}},
                           {"neither", pk("10.9.0.1", "10.3.0.1"), Verdict::pass, {1, 1, 0}},
                       });
}

TEST_CASE("chain: NOT (match -> end, miss -> action)", "[bpf][chain]") {
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", END, 1), step(MPS_ACT_DROP)};
    run_chain_cases(s, {
                           {"selected", pk("10.1.0.1", "10.2.0.1"), Verdict::pass, {1, 0}},
                           {"not selected", pk("10.9.0.1", "10.2.0.1"), Verdict::drop, {1, 1}},
                       });
}

TEST_CASE("chain: (A and not B) or C, actors continue to the next step", "[bpf][chain]") {
    // 0: A src 10.1/16 -> 1 | 2 ; 1: B dport 443 -> 2 (end of this branch: try C) | 3
    // 2: C dst 10.7/16 -> 3 | end ; 3: record -> 4 ; 4: drop
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", 1, 2), sel_port(PortDir::dst, 443, 443, 2, 3),
                               sel_dst("10.7.0.0/16", 3, END), step(MPS_ACT_RECORD, 4),
                               step(MPS_ACT_DROP)};
    run_chain_cases(
        s, {
               {"A, not B", pk("10.1.0.1", "10.2.0.1", 80), Verdict::drop, {1, 1, 0, 1, 1}},
               {"A and B, not C", pk("10.1.0.1", "10.2.0.1", 443), Verdict::pass, {1, 1, 1, 0, 0}},
               {"A and B and C", pk("10.1.0.1", "10.7.0.1", 443), Verdict::drop, {1, 1, 1, 1, 1}},
               {"not A, C", pk("10.9.0.1", "10.7.0.1", 80), Verdict::drop, {1, 0, 1, 1, 1}},
               {"nothing", pk("10.9.0.1", "10.2.0.1", 80), Verdict::pass, {1, 0, 1, 0, 0}},
           });
}

namespace {

// The same logic with program selectors, whose counters show the path taken: token A / token
// B, with the tokens written into four flows (ports 1001..1004: both, A only, B only, none).
constexpr uint32_t TA = 0xa0a0a0a0, TB = 0xb0b0b0b0;

Packet tok_pk(uint16_t port) {
    return Packet::v4("10.1.0.1", port, "10.2.0.1", 80).payload(4);
}

void run_token_cases(const std::vector<mps_step>& steps, const std::vector<ChainCase>& t) {
    Env env(chain_of(steps));
    const std::pair<uint16_t, std::pair<uint32_t, uint32_t>> flows[] = {
        {1001, {TA, TB}}, {1002, {TA, 0}}, {1003, {0, TB}}, {1004, {0, 0}}};
    for (auto& [port, toks] : flows) {
        mps_flow f{};
        f.token[0] = toks.first;
        f.token[1] = toks.second;
        env.put_flow(flow_key_of(tok_pk(port)), f);
    }
    for (const auto& c : t) {
        Bytes in = c.pkt.build();
        for (Hook h : kAllHooks) {
            INFO(c.name << " via " << name_of(h));
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(c.verdict, h));
            CHECK(r.out == in);
            for (size_t pc = 0; pc < steps.size(); pc++) {
                CAPTURE(pc);
                CHECK(step_delta(before, after, pc).runs == c.runs.at(pc));
            }
        }
    }
}

}  // namespace

TEST_CASE("chain: AND / OR / NOT with program selectors (path in the counters)", "[bpf][chain]") {
    SECTION("AND") {
        run_token_cases({sel_token(TA, 1, END), sel_token(TB, 2, END), step(MPS_ACT_DROP)},
                        {{"A and B", tok_pk(1001), Verdict::drop, {1, 1, 1}},
                         {"A only", tok_pk(1002), Verdict::pass, {1, 1, 0}},
                         {"B only", tok_pk(1003), Verdict::pass, {1, 0, 0}},
                         {"neither", tok_pk(1004), Verdict::pass, {1, 0, 0}}});
    }
    SECTION("OR") {
        run_token_cases({sel_token(TA, 2, 1), sel_token(TB, 2, END), step(MPS_ACT_DROP)},
                        {{"A and B", tok_pk(1001), Verdict::drop, {1, 0, 1}},
                         {"A only", tok_pk(1002), Verdict::drop, {1, 0, 1}},
                         {"B only", tok_pk(1003), Verdict::drop, {1, 1, 1}},
                         {"neither", tok_pk(1004), Verdict::pass, {1, 1, 0}}});
    }
    SECTION("NOT, then an actor that continues") {
        run_token_cases({sel_token(TA, END, 1), step(MPS_ACT_RECORD, 2), step(MPS_ACT_DROP)},
                        {{"A", tok_pk(1001), Verdict::pass, {1, 0, 0}},
                         {"not A", tok_pk(1003), Verdict::drop, {1, 1, 1}}});
    }
}

TEST_CASE("chain: policies in priority order, a miss falls to the next policy", "[bpf][chain]") {
    // policy 0 (first): dport 80 -> pass ; policy 1: src 10.1/16 -> drop
    std::vector<mps_step> s = {sel_port(PortDir::dst, 80, 80, 1, 2), step(MPS_ACT_PASS, END),
                               sel_src("10.1.0.0/16", 3, END), step(MPS_ACT_DROP)};
    s[2].policy = s[3].policy = 1;
    dp::ChainSet cs = chain_of(s);
    cs.policies = {"first", "second"};
    Env env(cs);
    struct C {
        std::string name;
        Packet p;
        Verdict v;
        std::vector<uint64_t> runs;
    };
    std::vector<C> t = {
        {"both policies select: the first wins",
         pk("10.1.0.1", "10.2.0.1", 80),
         Verdict::pass,
         {1, 1, 0, 0}},
        {"only the second selects", pk("10.1.0.1", "10.2.0.1", 81), Verdict::drop, {1, 0, 1, 1}},
        {"neither selects", pk("10.9.0.1", "10.2.0.1", 81), Verdict::pass, {1, 0, 1, 0}},
    };
    for (const auto& c : t) {
        for (Hook h : kAllHooks) {
            INFO(c.name << " via " << name_of(h));
            Snap before = Snap::of(env);
            Run r = env.run(h, c.p);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(c.v, h));
            for (size_t pc = 0; pc < s.size(); pc++) {
                CAPTURE(pc);
                CHECK(step_delta(before, after, pc).runs == (counted(s[pc]) ? c.runs[pc] : 0));
            }
        }
    }
}

namespace {

// A selector with its own program that always matches (flow bytes in [0, 2^64)).
mps_step prog_sel(uint16_t m, uint16_t miss = END) {
    return sel_bytes(MPS_BYTES_SUBFLOW, 0, ~0ull, m, miss);
}

// `steps` steps: `programs` program selectors (counted) among inline ones, then a drop.
std::vector<mps_step> long_chain(size_t steps, size_t programs) {
    // program selectors on the even positions first, then on the odd ones
    std::vector<size_t> order;
    for (size_t start : {0, 1})
        for (size_t i = start; i + 1 < steps; i += 2) order.push_back(i);
    std::vector<bool> prog(steps, false);
    for (size_t k = 0; k < programs && k < order.size(); k++) prog[order[k]] = true;
    std::vector<mps_step> s;
    for (size_t i = 0; i + 1 < steps; i++) {
        uint16_t next = uint16_t(i + 1);
        s.push_back(prog[i] ? prog_sel(next) : sel_port(PortDir::either, 0, 65535, next, END));
    }
    s.push_back(step(MPS_ACT_DROP));
    return s;
}

size_t programs_in(const std::vector<mps_step>& s) {
    size_t n = 0;
    for (auto& st : s) n += dp::has_program(static_cast<mps_prog>(st.prog));
    return n;
}

void expect_runs_through(const std::vector<mps_step>& s) {
    Env env(chain_of(s));
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Snap before = Snap::of(env);
        Run r = env.run(h, pk("10.1.0.1", "10.2.0.1"));
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::drop, h));
        for (size_t pc = 0; pc < s.size(); pc++) {
            CAPTURE(pc);
            uint64_t n = counted(s[pc]) ? 1 : 0;
            CHECK(step_delta(before, after, pc).runs == n);
            CHECK(step_delta(before, after, pc).matched == n);
        }
        CHECK(step_delta(before, after, s.size() - 1).drops == 1);
        CHECK(gen_delta(before, after, MPS_GC_CHAIN_TOO_LONG) == 0);
        CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
    }
}

}  // namespace

TEST_CASE("chain: 32 inline steps run to the end", "[bpf][chain]") {
    auto s = long_chain(MPS_MAX_CHAIN, 0);
    REQUIRE(s.size() == MPS_MAX_CHAIN);
    expect_runs_through(s);
}

TEST_CASE("chain: 32 steps, 16 of them programs (the most a path may enter)", "[bpf][chain]") {
    auto s = long_chain(MPS_MAX_CHAIN, dp::kMaxActorsPerPath);
    REQUIRE(s.size() == MPS_MAX_CHAIN);
    REQUIRE(programs_in(s) == size_t(dp::kMaxActorsPerPath));
    expect_runs_through(s);
}

TEST_CASE("chain: 32 steps along the miss branches", "[bpf][chain]") {
    // 31 selectors that miss and continue on miss (every other one a program), then a drop
    std::vector<mps_step> s;
    for (uint16_t i = 0; i < MPS_MAX_CHAIN - 1; i++)
        s.push_back(i % 2 ? sel_port(PortDir::dst, 1, 1, END, uint16_t(i + 1))
                          : sel_bytes(MPS_BYTES_SUBFLOW, 1ull << 40, ~0ull, END, uint16_t(i + 1)));
    s.push_back(step(MPS_ACT_DROP));
    Env env(chain_of(s));
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Snap before = Snap::of(env);
        Run r = env.run(h, pk("10.1.0.1", "10.2.0.1"));
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::drop, h));
        for (size_t pc = 0; pc < s.size(); pc++) {
            CAPTURE(pc);
            uint64_t n = counted(s[pc]) ? 1 : 0;
            CHECK(step_delta(before, after, pc).runs == n);
            CHECK(step_delta(before, after, pc).matched == (pc + 1 == s.size() ? 1u : 0u));
        }
    }
}

TEST_CASE("chain: the loader refuses longer chains, more program steps, cycles", "[bpf][chain]") {
    PinRoot root;
    auto state = dp::StateMaps::open(root.path());
    CHECK_THROWS_AS(dp::Generation::build(chain_of(long_chain(MPS_MAX_CHAIN + 1, 0)), 1, state),
                    dp::Error);
    auto many = long_chain(MPS_MAX_CHAIN, dp::kMaxActorsPerPath + 1);
    REQUIRE(programs_in(many) == size_t(dp::kMaxActorsPerPath + 1));
    CHECK_THROWS_AS(dp::Generation::build(chain_of(many), 1, state), dp::Error);
    auto cyc = long_chain(3, 0);
    cyc[1].on_match = 0;
    CHECK_THROWS_AS(dp::Generation::build(chain_of(cyc), 1, state), dp::Error);
}

TEST_CASE("chain: an inline loop is cut, counted as too long and passed", "[bpf][chain]") {
    // Built valid, then the last step is turned into a selector that jumps back to step 0
    // (in place, as a parameter update could): the datapath has to stop it on its own.
    auto s = long_chain(MPS_MAX_CHAIN, 0);
    Env env(chain_of(s));
    env.set_step(MPS_MAX_CHAIN - 1, sel_port(PortDir::either, 0, 65535, 0, END));
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Bytes in = pk("10.1.0.1", "10.2.0.1").build();
        Snap before = Snap::of(env);
        Run r = env.run(h, in);
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::pass, h));
        CHECK(r.out == in);
        CHECK(gen_delta(before, after, MPS_GC_CHAIN_TOO_LONG) == 1);
        CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
    }
}

TEST_CASE("chain: a loop through a program hits the kernel's tail-call limit, counted, passed",
          "[bpf][chain]") {
    Env env(chain_of({step(MPS_ACT_RECORD, 1), step(MPS_ACT_DROP)}));
    env.set_step(0, step(MPS_ACT_RECORD, 0));  // record -> record -> ...
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Bytes in = pk("10.1.0.1", "10.2.0.1").build();
        Snap before = Snap::of(env);
        Run r = env.run(h, in);
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::pass, h));
        CHECK(r.out == in);
        CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 1);
        // entry -> record is tail call 1, each record -> record one more (a program step
        // jumps straight to the next program step): the 33 the kernel allows make 33 runs;
        // the 34th call fails.
        CHECK(step_delta(before, after, 0).runs == 33);
        CHECK(step_delta(before, after, 0).missed_tail_calls == 1);
        CHECK(step_delta(before, after, 1).runs == 0);
    }
}

TEST_CASE("chain: a missing prog_array slot is a counted missed tail call", "[bpf][chain]") {
    for (uint32_t slot : {uint32_t(MPS_ACT_RECORD), uint32_t(MPS_PROG_NONE)}) {
        for (bool fail_drop : {false, true}) {
            std::vector<mps_step> s = {sel_port(PortDir::either, 0, 65535, 1, END),
                                       step(MPS_ACT_RECORD, 2), step(MPS_ACT_DROP)};
            if (fail_drop) s[1].flags |= MPS_STEPF_FAIL_DROP;
            Env env(chain_of(s));
            for (const char* m : {"jmp_xdp", "jmp_tc"})
                REQUIRE(bpf_map_delete_elem(env.generation().map_fd(m), &slot) == 0);
            for (Hook h : kAllHooks) {
                INFO(name_of(h) << (slot ? " record's slot" : " the interpreter's slot")
                                << (fail_drop ? ", fail=drop" : ", fail=pass"));
                Bytes in = pk("10.1.0.1", "10.2.0.1").build();
                Snap before = Snap::of(env);
                Run r = env.run(h, in);
                Snap after = Snap::of(env);
                CHECK(r.retval == retval_of(fail_drop ? Verdict::drop : Verdict::pass, h));
                CHECK(r.out == in);
                CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 1);
                // record never runs without its slot; without the interpreter it runs and
                // cannot hand back
                CHECK(step_delta(before, after, 1).runs == (slot ? 0u : 1u));
                CHECK(step_delta(before, after, 1).missed_tail_calls == 1);
                CHECK(step_delta(before, after, 2).runs == 0);
            }
        }
    }
}

TEST_CASE("chain: a missing slot for the first step", "[bpf][chain]") {
    Env env(chain_of({step(MPS_ACT_RECORD, 1), step(MPS_ACT_DROP)}));
    uint32_t slot = MPS_ACT_RECORD;
    for (const char* m : {"jmp_xdp", "jmp_tc"})
        REQUIRE(bpf_map_delete_elem(env.generation().map_fd(m), &slot) == 0);
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Bytes in = pk("10.1.0.1", "10.2.0.1").build();
        Snap before = Snap::of(env);
        Run r = env.run(h, in);
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::pass, h));
        CHECK(r.out == in);
        CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 1);
        CHECK(step_delta(before, after, 0).runs == 0);
        CHECK(step_delta(before, after, 0).missed_tail_calls == 1);
    }
}

TEST_CASE("chain: hooks have their own entries", "[bpf][chain]") {
    // XDP drops, TC egress passes, TC ingress has no chain
    dp::ChainSet cs;
    cs.steps = {step(MPS_ACT_DROP), step(MPS_ACT_PASS)};
    cs.policies = {"p"};
    cs.entries = {{Hook::xdp, "", 0}, {Hook::tc_egress, "", 1}};
    Env env(cs);
    Bytes in = pk("10.1.0.1", "10.2.0.1").build();
    CHECK(env.run(Hook::xdp, in).retval == XDP_DROP_);
    CHECK(env.run(Hook::tc_egress, in).retval == TC_PASS_);
    CHECK(env.run(Hook::tc_ingress, in).retval == TC_PASS_);
    auto s = env.steps();
    CHECK(s[0].runs == 1);
    CHECK(s[1].runs == 1);
}

TEST_CASE("chain: the frame leaves XDP without the metadata its programs passed along",
          "[bpf][chain]") {
    // Program steps pass the context in a per-CPU map at XDP, not as metadata: metadata would
    // ride on the skb, and GRO merges only segments whose metadata is the same. Each chain ends
    // in a different place: an actor, the interpreter after an actor, a selector program,
    // rate_limit.
    const std::vector<std::pair<const char*, std::vector<mps_step>>> chains = {
        {"record last", {step(MPS_ACT_RECORD, END)}},
        {"record, then pass", {step(MPS_ACT_RECORD, 1), step(MPS_ACT_PASS)}},
        {"flow_bytes last", {sel_bytes(MPS_BYTES_SUBFLOW, 0, ~0ull, END, END)}},
        {"rate_limit last", {act_rate(1'000'000, 1000, 1u << 30, END)}},
    };
    Bytes in = pk("10.1.0.1", "10.2.0.1").build();
    for (const auto& [what, steps] : chains) {
        INFO(what);
        Env env(chain_of(steps));
        for (Hook h : kAllHooks) {
            INFO(name_of(h));
            auto r = dp::test_run(env.generation().entry_fd(h), in, is_xdp(h));
            CHECK(r.retval == retval_of(Verdict::pass, h));
            CHECK(r.meta_len == 0);
            CHECK(r.out == in);
        }
        CHECK(env.steps()[0].runs == 3);
    }
}

namespace {
// BPF_PROG_TEST_RUN with the packet arriving on (XDP) or leaving through (TC) `ifindex`.
uint32_t run_on(int prog_fd, const Bytes& frame, bool xdp, uint32_t ifindex) {
    if (!xdp) return dp::test_run(prog_fd, frame, false, 1, ifindex).retval;
    Bytes out(frame.size() + 512);
    xdp_md ctx{};
    ctx.data_end = uint32_t(frame.size());
    ctx.ingress_ifindex = ifindex;
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = out.data(),
                .data_size_in = uint32_t(frame.size()), .data_size_out = uint32_t(out.size()),
                .ctx_in = &ctx, .ctx_size_in = sizeof ctx);
    if (bpf_prog_test_run_opts(prog_fd, &opts) != 0)
        throw std::runtime_error(std::string("BPF_PROG_TEST_RUN: ") + std::strerror(errno));
    return opts.retval;
}
}  // namespace

TEST_CASE("chain: per-interface entries run on their interface only", "[bpf][chain]") {
    // In a private network namespace (gone with this thread): lo and a veth (no dummy module here).
    std::string failure;
    std::thread([&] {
        try {
            if (unshare(CLONE_NEWNET) != 0)
                throw std::runtime_error("unshare(CLONE_NEWNET) failed");
            if (std::system(
                    "ip link add mps-ifent type veth peer name mps-ifent-p && ip link set mps-ifent up") !=
                0)
                throw std::runtime_error("creating the veth pair failed");
            const uint32_t lo = 1, veth = if_nametoindex("mps-ifent");
            // Every policy names its interface, so each hook's default is "no chain" (END):
            // XDP drops on the veth only, TC egress drops on lo only.
            dp::ChainSet cs;
            cs.steps = {step(MPS_ACT_DROP)};
            cs.policies = {"p"};
            cs.entries = {{Hook::xdp, "mps-ifent", 0}, {Hook::tc_egress, "lo", 0}};
            Env env(cs);
            Bytes in = pk("10.1.0.1", "10.2.0.1").build();
            const auto& g = env.generation();
            auto expect = [&](Hook h, uint32_t ifindex, Verdict v) {
                if (run_on(g.entry_fd(h), in, is_xdp(h), ifindex) != retval_of(v, h))
                    throw std::runtime_error(std::string(name_of(h)) + " on ifindex " +
                                             std::to_string(ifindex) + ": wrong verdict");
            };
            expect(Hook::xdp, veth, Verdict::drop);
            expect(Hook::xdp, lo, Verdict::pass);
            expect(Hook::tc_egress, lo, Verdict::drop);
            expect(Hook::tc_egress, veth, Verdict::pass);
            expect(Hook::tc_ingress, lo, Verdict::pass);
            expect(Hook::tc_ingress, veth, Verdict::pass);
            if (env.steps()[0].drops != 2)
                throw std::runtime_error("the drop step counted " +
                                         std::to_string(env.steps()[0].drops) + " drops, not 2");
        } catch (const std::exception& e) {
            failure = e.what();
        }
    }).join();
    INFO(failure);
    CHECK(failure.empty());
}

TEST_CASE(
    "generations: a staged slot runs only in pre-flight until the flip; the flip back restores",
    "[bpf][chain]") {
    PinRoot root;
    auto state = dp::StateMaps::open(root.path());
    auto g1 =
        dp::Generation::build(chain_of({step(MPS_ACT_PASS)}), 1, state,
                              {"preflight_xdp", "preflight_tc_egress", "preflight_tc_ingress"});
    auto g2 = dp::Generation::stage(g1->datapath(), chain_of({step(MPS_ACT_DROP)}), 2);
    CHECK(g1->active());
    CHECK_FALSE(g2->active());
    CHECK(g2->slot() != g1->slot());
    Bytes in = pk("10.1.0.1", "10.2.0.1").build();
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        CHECK(raw_run(g1->entry_fd(h), in, is_xdp(h)).retval == retval_of(Verdict::pass, h));
        CHECK(raw_run(g2->preflight_fd(h), in, is_xdp(h)).retval == retval_of(Verdict::drop, h));
    }
    g2->activate();
    for (Hook h : kAllHooks)
        CHECK(raw_run(g2->entry_fd(h), in, is_xdp(h)).retval == retval_of(Verdict::drop, h));
    // Each slot counts its own packets: 3 pre-flight + 3 live runs of g2, 3 of g1.
    CHECK(g1->step_counters()[0].runs == 3);
    CHECK(g2->step_counters()[0].runs == 6);
    g1->activate();  // the rollback: g1's slot was never written
    for (Hook h : kAllHooks)
        CHECK(raw_run(g1->entry_fd(h), in, is_xdp(h)).retval == retval_of(Verdict::pass, h));
    // Staging again waits out the old slot's packets, then overwrites it (zeroed counters).
    auto g3 = dp::Generation::stage(g1->datapath(), chain_of({step(MPS_ACT_DROP)}), 3);
    CHECK(g3->slot() == g2->slot());
    CHECK(g3->step_counters()[0].runs == 0);
}
