// Chain semantics: AND / OR / NOT from the branch targets, policies tried in priority order,
// the longest chain, chains cut for length, and a missing prog_array slot.
#include <catch2/catch.hpp>

#include <bpf/bpf.h>

#include "bpf_env.h"

using namespace mpsteer::test;

namespace {

const std::vector<Hook> kAllHooks = {Hook::xdp, Hook::tc_egress, Hook::tc_ingress};

struct ChainCase {
    std::string name;
    Packet pkt;
    Verdict verdict;
    std::vector<uint64_t> runs;  // expected runs per step
};

void run_chain_cases(const std::vector<mps_step>& steps, const std::vector<ChainCase>& t)
{
    Env env(chain_of(steps));
    for (const auto& c : t) {
        Bytes in = c.pkt.build();
        for (Hook h : kAllHooks) {
            INFO(c.name << " via " << name_of(h));
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(c.verdict, h));
            if (r.out != in)
                FAIL_CHECK("frame modified\n" << describe_frame(r.out, in));
            for (size_t pc = 0; pc < steps.size(); pc++) {
                CAPTURE(pc);
                CHECK(step_delta(before, after, pc).runs == c.runs.at(pc));
            }
            CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
            CHECK(gen_delta(before, after, MPS_GC_CHAIN_TOO_LONG) == 0);
        }
    }
}

Packet pk(const char* src, const char* dst, uint16_t dport = 80)
{
    return Packet::v4(src, 40000, dst, dport).payload(4);
}

}  // namespace

TEST_CASE("chain: AND (match -> next selector, miss -> end)", "[bpf][chain]")
{
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", 1, END), sel_dst("10.2.0.0/16", 2, END),
                               step(MPS_ACT_DROP)};
    run_chain_cases(s, {
        {"both", pk("10.1.0.1", "10.2.0.1"), Verdict::drop, {1, 1, 1}},
        {"first only", pk("10.1.0.1", "10.3.0.1"), Verdict::pass, {1, 1, 0}},
        {"second only", pk("10.9.0.1", "10.2.0.1"), Verdict::pass, {1, 0, 0}},
        {"neither", pk("10.9.0.1", "10.3.0.1"), Verdict::pass, {1, 0, 0}},
    });
}

TEST_CASE("chain: OR (match -> action, miss -> next selector)", "[bpf][chain]")
{
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", 2, 1), sel_dst("10.2.0.0/16", 2, END),
                               step(MPS_ACT_DROP)};
    run_chain_cases(s, {
        {"both", pk("10.1.0.1", "10.2.0.1"), Verdict::drop, {1, 0, 1}},
        {"first only", pk("10.1.0.1", "10.3.0.1"), Verdict::drop, {1, 0, 1}},
        {"second only", pk("10.9.0.1", "10.2.0.1"), Verdict::drop, {1, 1, 1}},
        {"neither", pk("10.9.0.1", "10.3.0.1"), Verdict::pass, {1, 1, 0}},
    });
}

TEST_CASE("chain: NOT (match -> end, miss -> action)", "[bpf][chain]")
{
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", END, 1), step(MPS_ACT_DROP)};
    run_chain_cases(s, {
        {"selected", pk("10.1.0.1", "10.2.0.1"), Verdict::pass, {1, 0}},
        {"not selected", pk("10.9.0.1", "10.2.0.1"), Verdict::drop, {1, 1}},
    });
}

TEST_CASE("chain: (A and not B) or C, actors continue to the next step", "[bpf][chain]")
{
    // 0: A src 10.1/16 -> 1 | 2 ; 1: B dport 443 -> 2 (end of this branch: try C) | 3
    // 2: C dst 10.7/16 -> 3 | end ; 3: record -> 4 ; 4: drop
    std::vector<mps_step> s = {sel_src("10.1.0.0/16", 1, 2), sel_port(MPS_DIR_DST, 443, 443, 2, 3),
                               sel_dst("10.7.0.0/16", 3, END), step(MPS_ACT_RECORD, 4),
                               step(MPS_ACT_DROP)};
    run_chain_cases(s, {
        {"A, not B", pk("10.1.0.1", "10.2.0.1", 80), Verdict::drop, {1, 1, 0, 1, 1}},
        {"A and B, not C", pk("10.1.0.1", "10.2.0.1", 443), Verdict::pass, {1, 1, 1, 0, 0}},
        {"A and B and C", pk("10.1.0.1", "10.7.0.1", 443), Verdict::drop, {1, 1, 1, 1, 1}},
        {"not A, C", pk("10.9.0.1", "10.7.0.1", 80), Verdict::drop, {1, 0, 1, 1, 1}},
        {"nothing", pk("10.9.0.1", "10.2.0.1", 80), Verdict::pass, {1, 0, 1, 0, 0}},
    });
}

TEST_CASE("chain: policies in priority order, a miss falls to the next policy", "[bpf][chain]")
{
    // policy 0 (first): dport 80 -> pass ; policy 1: src 10.1/16 -> drop
    std::vector<mps_step> s = {sel_port(MPS_DIR_DST, 80, 80, 1, 2), step(MPS_ACT_PASS, END),
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
        {"both policies select: the first wins", pk("10.1.0.1", "10.2.0.1", 80), Verdict::pass, {1, 1, 0, 0}},
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
                CHECK(step_delta(before, after, pc).runs == c.runs[pc]);
            }
        }
    }
}

namespace {

// n selectors that all match (any port), then a drop: n + 1 steps.
std::vector<mps_step> long_chain(size_t selectors)
{
    std::vector<mps_step> s;
    for (size_t i = 0; i < selectors; i++)
        s.push_back(sel_port(MPS_DIR_EITHER, 0, 65535, uint16_t(i + 1), END));
    s.push_back(step(MPS_ACT_DROP));
    return s;
}

}  // namespace

TEST_CASE("chain: 32 steps (31 selectors and an actor) run to the end", "[bpf][chain]")
{
    auto s = long_chain(MPS_MAX_CHAIN - 1);
    REQUIRE(s.size() == MPS_MAX_CHAIN);
    Env env(chain_of(s));
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Snap before = Snap::of(env);
        Run r = env.run(h, pk("10.1.0.1", "10.2.0.1"));
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::drop, h));
        for (size_t pc = 0; pc < s.size(); pc++) {
            CAPTURE(pc);
            CHECK(step_delta(before, after, pc).runs == 1);
            CHECK(step_delta(before, after, pc).matched == 1);
        }
        CHECK(step_delta(before, after, s.size() - 1).drops == 1);
        CHECK(gen_delta(before, after, MPS_GC_CHAIN_TOO_LONG) == 0);
        CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
    }
}

TEST_CASE("chain: 32 steps along the miss branches", "[bpf][chain]")
{
    // 31 selectors that miss (dst port 1) and continue on miss, then a drop
    std::vector<mps_step> s;
    for (uint16_t i = 0; i < MPS_MAX_CHAIN - 1; i++)
        s.push_back(sel_port(MPS_DIR_DST, 1, 1, END, uint16_t(i + 1)));
    s.push_back(step(MPS_ACT_DROP));
    Env env(chain_of(s));
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        Snap before = Snap::of(env);
        Run r = env.run(h, pk("10.1.0.1", "10.2.0.1"));
        Snap after = Snap::of(env);
        CHECK(r.retval == retval_of(Verdict::drop, h));
        uint64_t runs = 0, matched = 0;
        for (size_t pc = 0; pc < s.size(); pc++) {
            runs += step_delta(before, after, pc).runs;
            matched += step_delta(before, after, pc).matched;
        }
        CHECK(runs == MPS_MAX_CHAIN);
        CHECK(matched == 1);  // only the drop
    }
}

TEST_CASE("chain: the loader refuses a chain longer than 32 steps", "[bpf][chain]")
{
    PinRoot root;
    auto state = dp::StateMaps::open(root.path());
    CHECK_THROWS_AS(dp::Generation::build(chain_of(long_chain(MPS_MAX_CHAIN)), 1, state), dp::Error);
    // and a cycle
    auto cyc = long_chain(3);
    cyc[2].on_match = 0;
    CHECK_THROWS_AS(dp::Generation::build(chain_of(cyc), 1, state), dp::Error);
}

TEST_CASE("chain: a chain that would run too long is cut, counted and passed", "[bpf][chain]")
{
    // Built valid, then the last step is turned into a selector that jumps back to step 0
    // (in place, as a parameter update could): the datapath has to stop it on its own.
    auto s = long_chain(MPS_MAX_CHAIN - 1);
    Env env(chain_of(s));
    env.set_step(MPS_MAX_CHAIN - 1, sel_port(MPS_DIR_EITHER, 0, 65535, 0, END));
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
        uint64_t runs = 0;
        for (size_t pc = 0; pc < s.size(); pc++)
            runs += step_delta(before, after, pc).runs;
        // The entry's tail call plus 32 more: 33 steps run, the most the kernel allows
        // (MAX_TAIL_CALL_CNT = 33); the 34th jump is refused by the datapath itself.
        CHECK(runs == MPS_MAX_CHAIN + 1);
        CHECK(step_delta(before, after, 0).runs == 2);
    }
}

TEST_CASE("chain: a missing prog_array slot is a counted missed tail call", "[bpf][chain]")
{
    for (bool fail_drop : {false, true}) {
        std::vector<mps_step> s = {sel_port(MPS_DIR_EITHER, 0, 65535, 1, END), step(MPS_ACT_RECORD, 2),
                                   step(MPS_ACT_DROP)};
        if (fail_drop)
            s[1].flags |= MPS_STEPF_FAIL_DROP;
        Env env(chain_of(s));
        // step 2 loses its program in both prog arrays
        uint32_t pc = 2;
        for (const char* m : {"jmp_xdp", "jmp_tc"})
            REQUIRE(bpf_map_delete_elem(env.generation().map_fd(m), &pc) == 0);
        for (Hook h : kAllHooks) {
            INFO(name_of(h) << (fail_drop ? " fail=drop" : " fail=pass"));
            Bytes in = pk("10.1.0.1", "10.2.0.1").build();
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(fail_drop ? Verdict::drop : Verdict::pass, h));
            CHECK(r.out == in);
            CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 1);
            CHECK(step_delta(before, after, 0).runs == 1);
            CHECK(step_delta(before, after, 1).runs == 1);
            CHECK(step_delta(before, after, 1).missed_tail_calls == 1);
            CHECK(step_delta(before, after, 2).runs == 0);
        }
    }
}

TEST_CASE("chain: a missing first slot is counted by the entry program", "[bpf][chain]")
{
    Env env(chain_of({sel_port(MPS_DIR_EITHER, 0, 65535, 1, END), step(MPS_ACT_DROP)}));
    uint32_t pc = 0;
    for (const char* m : {"jmp_xdp", "jmp_tc"})
        REQUIRE(bpf_map_delete_elem(env.generation().map_fd(m), &pc) == 0);
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
    }
}

TEST_CASE("chain: hooks have their own entries", "[bpf][chain]")
{
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

TEST_CASE("dp::test_run returns the XDP frame without its metadata (L1)", "[bpf][harness][!mayfail]")
{
    Env env(chain_of({step(MPS_ACT_PASS)}));
    Bytes in = pk("10.1.0.1", "10.2.0.1").build();
    auto r = dp::test_run(env.generation().entry_fd(Hook::xdp), in, true);
    CHECK(r.retval == XDP_PASS_);
    CHECK(r.out.size() == in.size());
    CHECK(r.out == in);
}

TEST_CASE("harness: our XDP run strips exactly the metadata", "[bpf][harness]")
{
    Env env(chain_of({step(MPS_ACT_PASS)}));
    Bytes in = pk("10.1.0.1", "10.2.0.1").build();
    Run mine = env.run(Hook::xdp, in);
    auto theirs = dp::test_run(env.generation().entry_fd(Hook::xdp), in, true);
    REQUIRE(theirs.out.size() == in.size() + sizeof(mps_pkt_ctx));
    CHECK(mine.out == in);
    CHECK(Bytes(theirs.out.begin() + sizeof(mps_pkt_ctx), theirs.out.end()) == in);
    // TC: both agree
    auto tc = dp::test_run(env.generation().entry_fd(Hook::tc_egress), in, false);
    CHECK(tc.out == env.run(Hook::tc_egress, in).out);
}
