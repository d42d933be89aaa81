// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Compiled entries (emitted by src/datapath/entry_emitter.cpp): each one must do exactly what
// the entry program's interpreter does with the same generation — verdict, output bytes,
// counters — for the packets it takes and for the ones it hands on; it runs only while its
// generation is active, in test mode during pre-flight, and steps aside when a step it holds
// is rewritten.
#include <catch2/catch.hpp>

#include <bpf/bpf.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>

#include "bpf_env.h"
#include "datapath/entry_emitter.h"
#include "datapath/frames.h"

using namespace mpsteer::test;
namespace mt = mptcp;

namespace {

const std::vector<Hook> kAllHooks = {Hook::xdp, Hook::tc_egress, Hook::tc_ingress};

// Frames of every shape the fast path takes or hands on.
std::vector<std::pair<std::string, Packet>> frames() {
    auto data = [] {
        return Packet::v4("10.1.0.1", 40000, "10.2.0.1", 5201)
            .option(opt::nop())
            .option(opt::nop())
            .option(opt::timestamps(1, 2))
            .option(mt::dss(mt::Dss().ack(7).map(100, 1, 64)))
            .payload(64);
    };
    std::vector<std::pair<std::string, Packet>> v;
    v.emplace_back("IPv4 DSS data", data());
    // NOP NOP TS then a DSS that ends the header: the walk's result without the walk.
    auto ts_then = [](Bytes option) {
        return Packet::v4("10.1.0.1", 40000, "10.2.0.1", 5201)
            .option(opt::nop())
            .option(opt::nop())
            .option(opt::timestamps(5, 6))
            .option(std::move(option));
    };
    v.emplace_back("IPv4 DATA_ACK ending the header",
                   ts_then(mt::dss(mt::Dss().ack(7))).payload(8));
    v.emplace_back("IPv4 DATA_FIN ending the header",
                   ts_then(mt::dss(mt::Dss().ack(7, false).fin())));
    v.emplace_back("IPv4 DSS without flags ending the header", ts_then(mt::dss(mt::Dss())));
    v.emplace_back("IPv4 DSS, then padding", ts_then(mt::dss(mt::Dss().ack(7, false)))
                                                 .option(opt::nop())
                                                 .option(opt::nop())
                                                 .option(opt::nop())
                                                 .option(opt::nop()));
    v.emplace_back("IPv4 DSS, then ADD_ADDR",
                   ts_then(mt::dss(mt::Dss().ack(7, false)))
                       .option(mt::add_addr(ip4("10.3.0.1"), 2, std::nullopt, false, 0x1122)));
    v.emplace_back("IPv4 DSS of length 3 after timestamps", ts_then(opt::raw(30, {0x20})));
    v.emplace_back("IPv4 DSS claiming past the header", ts_then(opt::raw(30, {0x20, 0x01}, 12)));
    v.emplace_back("IPv4 MP_PRIO ending the header", ts_then(mt::mp_prio_v0(true, 1)));
    v.emplace_back("IPv4 reverse, plain ACK", Packet::v4("10.2.0.1", 5201, "10.1.0.1", 40000));
    v.emplace_back("IPv4 timestamps, no MPTCP option",
                   Packet::v4("10.1.0.1", 40000, "10.2.0.1", 5201)
                       .option(opt::nop())
                       .option(opt::nop())
                       .option(opt::timestamps(3, 4))
                       .payload(10));
    v.emplace_back("IPv4 other addresses",
                   Packet::v4("192.0.2.1", 1000, "192.0.2.2", 80).payload(8));
    v.emplace_back("IPv4 ADD_ADDR",
                   Packet::v4("10.2.0.1", 5201, "10.1.0.1", 40000)
                       .option(mt::add_addr(ip4("10.3.0.1"), 2, std::nullopt, false, 0x1122)));
    v.emplace_back(
        "IPv4 MP_CAPABLE SYN",
        Packet::v4("10.1.0.1", 40001, "10.2.0.1", 5201).flags(tcpf::SYN).option(mt::capable_syn()));
    v.emplace_back("IPv4 3-byte MP_JOIN beside MP_CAPABLE",
                   Packet::v4("10.1.0.1", 40000, "10.2.0.1", 5201)
                       .option(opt::raw(30, {0x10}))
                       .option(mt::capable_ack(1, 2)));
    v.emplace_back("IPv4 MP_CAPABLE of 20 with data", data().option(mt::capable_ack(1, 2)));
    auto opts = data();
    opts.v4h().options = {1, 1, 1, 0};  // NOP NOP NOP EOL: ihl 6
    v.emplace_back("IPv4 with IP options", opts);
    v.emplace_back("802.1Q", data().vlan(0x8100, 7));
    v.emplace_back("IPv6 DSS data", Packet::v6("fd00::1", 40000, "fd00::2", 5201)
                                        .option(mt::dss(mt::Dss().ack(7)))
                                        .payload(16));
    auto frag = data();
    frag.v4h().frag = 0x2000;  // MF
    v.emplace_back("IPv4 fragment", frag);
    auto bad_opt = Packet::v4("10.1.0.1", 40000, "10.2.0.1", 5201).option(opt::raw(30, {0x20}, 1));
    v.emplace_back("option length 1", bad_opt);
    auto doff = data();
    doff.tcp.doff = 15;
    v.emplace_back("doff past the IP length", doff);
    auto tot = data();
    tot.v4h().tot_len = 1400;
    v.emplace_back("IP length past the frame", tot);
    auto cut = data();
    cut.truncate = 40;
    v.emplace_back("truncated", cut);
    auto ef = data();
    ef.v4h().tos = 0xb9;  // DSCP 46 (EF), ECN 1
    ef.v4h().ttl = 3;
    v.emplace_back("IPv4 TOS 0xb9, TTL 3", ef);
    return v;
}

std::vector<mps_step> guarded(std::vector<mps_step> s) {
    for (auto& st : s) st.flags |= MPS_STEPF_FAIL_DROP;
    return s;
}

// Chains covering every inline selector, the compositions and a program step.
std::vector<std::pair<std::string, std::vector<mps_step>>> chains() {
    return {
        {"MP_JOIN or MP_CAPABLE, drop, under a guard (failure mode drop)",
         guarded({sel_kinds(MPS_K_MP_JOIN, 2, 1), sel_kinds(MPS_K_MP_CAPABLE, 2, END),
                  step(MPS_ACT_DROP)})},
        {"dst, port, packet_type, drop",
         {sel_dst("10.2.0.0/16", 1, END), sel_port(PortDir::dst, 5201, 5201, 2, END),
          sel_kinds(MPS_K_DSS, 3, END), step(MPS_ACT_DROP)}},
        {"(src and not port) or pair, then record, then drop",
         {sel_src("10.1.0.0/16", 1, 2), sel_port(PortDir::either, 80, 80, 2, 3),
          sel_ip_pair("10.2.0.1", "10.1.0.1", 3, END), step(MPS_ACT_RECORD, 4),
          step(MPS_ACT_DROP)}},
        {"subflow either way, else kinds ADD_ADDR drop, else pass",
         {sel_subflow("10.1.0.1", 40000, "10.2.0.1", 5201, 3, 1), sel_kinds(MPS_K_ADD_ADDR, 2, END),
          step(MPS_ACT_DROP), step(MPS_ACT_PASS)}},
        {"IPv6 CIDR (never an IPv4 packet), else drop",
         {sel_dst("fd00::/8", END, 1), step(MPS_ACT_DROP)}},
        // Steps reached both with and without the option walk (the walk is then checked at
        // run time, and the program step gets the kinds only when they were found).
        {"src or kinds, then record; kinds, then timestamp kinds, drop",
         {sel_src("10.1.0.0/16", 1, 3), sel_kinds(MPS_K_DSS, 2, 3),
          sel_kinds(MPS_K_TIMESTAMP, 4, END), step(MPS_ACT_RECORD, 4), step(MPS_ACT_DROP)}},
        {"src, else kinds; timestamp kinds walked either way, drop",
         {sel_src("10.1.0.0/16", 1, 2), sel_kinds(MPS_K_DSS, 2, END),
          sel_kinds(MPS_K_TIMESTAMP, 3, END), step(MPS_ACT_DROP)}},
        // Each kind the walk finds sends a packet on (match) or to a verdict of its own.
        {"ACK, payload, DATA_ACK, plain TCP, timestamp kinds, each else its own verdict",
         {sel_kinds(MPS_K_ACK, 1, 6), sel_kinds(MPS_K_PAYLOAD, 2, 7),
          sel_kinds(MPS_K_DATA_ACK, 3, 8), sel_kinds(MPS_K_PLAIN_TCP, 4, 9),
          sel_kinds(MPS_K_TIMESTAMP | MPS_K_FIN, 5, 10), step(MPS_ACT_DROP), step(MPS_ACT_PASS),
          step(MPS_ACT_DROP), step(MPS_ACT_PASS), step(MPS_ACT_DROP), step(MPS_ACT_PASS)}},
        {"DATA_FIN drop, else DATA_ACK pass, else drop",
         {sel_kinds(MPS_K_DATA_FIN, 1, 2), step(MPS_ACT_DROP), sel_kinds(MPS_K_DATA_ACK, 3, 4),
          step(MPS_ACT_PASS), step(MPS_ACT_DROP)}},
        {"TTL 1-5 (the IP word), else DSCP 46 either way with the ports, drop",
         {dp::Match().test(MPS_W_IP, 0xff, 1, 5).step(2, 1),
          dp::Match(0, true)
              .test(MPS_W_IP, 0xfc00, 46u << 10, 46u << 10)
              .test(MPS_W_PORTS, ~0u, 40000u << 16 | 5201, 40000u << 16 | 5201)
              .step(2, END),
          step(MPS_ACT_DROP)}},
        {"port range either way, /0, /32, pass",
         {sel_port(PortDir::either, 1024, 65535, 1, END), sel_dst("0.0.0.0/0", 2, END),
          sel_src("10.1.0.1/32", 3, END), step(MPS_ACT_PASS)}},
    };
}

}  // namespace

TEST_CASE("compiled entries: same verdict, bytes and counters as the interpreter",
          "[bpf][compiled]") {
    for (const auto& [cname, steps] : chains()) {
        Env env(chain_of(steps));
        const auto& g = env.generation();
        for (Hook h : kAllHooks) {
            INFO(cname << " via " << name_of(h));
            REQUIRE(g.compiled(h));
            const int fast = g.entry_fd(h), interp = g.datapath()->entry_fd(h);
            REQUIRE(fast != interp);
            for (const auto& [fname, pkt] : frames()) {
                INFO(fname);
                Bytes in = pkt.build();
                // What program steps see shows in the flow they account and the events.
                auto flow_packets = [&] {
                    auto f = env.flow(pkt);
                    return f ? f->dir_ab.packets + f->dir_ba.packets : 0;
                };
                auto run = [&](int fd) {  // each from no flow state (a SYN learns the flow)
                    const auto key = flow_key_of(pkt);
                    bpf_map_delete_elem(env.state().flows(), &key);
                    env.events();
                    Snap before = Snap::of(env);
                    const uint64_t packets = flow_packets();
                    Run r = raw_run(fd, in, is_xdp(h));
                    Snap after = Snap::of(env);
                    std::vector<int> events;
                    for (const auto& e : env.events()) events.push_back(e.raw.type);
                    return std::tuple{r, before, after, flow_packets() - packets, events};
                };
                auto [rf, bf, af, pf, ef] = run(fast);
                auto [ri, bi, ai, pi, ei] = run(interp);
                CHECK(rf.retval == ri.retval);
                CHECK(pf == pi);
                CHECK(ef == ei);
                if (rf.out != ri.out)
                    FAIL_CHECK("output differs\n" << describe_frame(rf.out, ri.out));
                for (size_t pc = 0; pc < steps.size(); ++pc) {
                    CAPTURE(pc);
                    CHECK(step_delta(bf, af, pc).runs == step_delta(bi, ai, pc).runs);
                    CHECK(step_delta(bf, af, pc).drops == step_delta(bi, ai, pc).drops);
                }
                for (int c = 0; c < MPS_GC_MAX; ++c) {
                    CAPTURE(c);
                    CHECK(gen_delta(bf, af, mps_gen_counter(c)) ==
                          gen_delta(bi, ai, mps_gen_counter(c)));
                }
                CHECK(gen_delta(bf, af, MPS_GC_MISSED_TAIL_CALL) == 0);
            }
        }
    }
}

TEST_CASE("compiled entries: only while their generation is active, and staged in pre-flight",
          "[bpf][compiled]") {
    CpuPin cpu;
    PinRoot root;
    auto state = dp::StateMaps::open(root.path());
    auto g1 = dp::Generation::build(
        chain_of({sel_dst("10.2.0.0/16", 1, END), step(MPS_ACT_PASS)}), 1, state,
        {"preflight_xdp", "preflight_tc_egress", "preflight_tc_ingress"});
    auto g2 = dp::Generation::stage(
        g1->datapath(), chain_of({sel_dst("10.2.0.0/16", 1, END), step(MPS_ACT_DROP)}), 2);
    g2->emit_entries();
    Bytes data = Packet::v4("10.1.0.1", 40000, "10.2.0.1", 80).payload(4).build();
    Bytes syn = Packet::v4("10.1.0.1", 40000, "10.2.0.1", 80).flags(tcpf::SYN).build();
    for (Hook h : kAllHooks) {
        INFO(name_of(h));
        REQUIRE(g1->compiled(h));
        REQUIRE(g2->compiled(h));
        // g2 is staged: its entry (what a link would already hold) runs g1, the live one.
        for (const Bytes& f : {data, syn})
            CHECK(raw_run(g2->entry_fd(h), f, is_xdp(h)).retval == retval_of(Verdict::pass, h));
    }
    // Pre-flight: g2's own chain, through the compiled entries too (a SYN through the
    // preflight entry they hand it to).
    for (const auto& [h, r] : g2->preflight(data)) CHECK(r.retval == retval_of(Verdict::drop, h));
    for (const auto& [h, r] : g2->preflight(syn)) CHECK(r.retval == retval_of(Verdict::drop, h));
    CHECK(g2->step_counters()[1].drops == 12);  // 2 frames x (3 preflight + 3 compiled)
    // ...and test mode is over: the live path still runs g1.
    for (Hook h : kAllHooks)
        CHECK(raw_run(g2->entry_fd(h), data, is_xdp(h)).retval == retval_of(Verdict::pass, h));
    g2->activate();
    for (Hook h : kAllHooks) {
        CHECK(raw_run(g1->entry_fd(h), data, is_xdp(h)).retval == retval_of(Verdict::drop, h));
        CHECK(raw_run(g2->entry_fd(h), data, is_xdp(h)).retval == retval_of(Verdict::drop, h));
    }
    g1->activate();  // rollback: g1's entries run their own chain again
    for (Hook h : kAllHooks) {
        CHECK(raw_run(g1->entry_fd(h), data, is_xdp(h)).retval == retval_of(Verdict::pass, h));
        CHECK(raw_run(g2->entry_fd(h), syn, is_xdp(h)).retval == retval_of(Verdict::pass, h));
    }
}

TEST_CASE("compiled entries: a rewritten inline step retires the old entries", "[bpf][compiled]") {
    Env env(chain_of({sel_dst("10.2.0.0/16", 1, END), step(MPS_ACT_DROP)}));
    Bytes in = Packet::v4("10.1.0.1", 40000, "10.2.0.1", 80).payload(4).build();
    std::vector<dp::Fd> old;  // as a link would: holding the programs
    for (Hook h : kAllHooks) {
        old.emplace_back(dup(env.generation().entry_fd(h)));
        CHECK(env.run(h, in).retval == retval_of(Verdict::drop, h));
    }
    env.set_step(0, sel_dst("10.9.0.0/16", 1, END));
    for (size_t i = 0; i < kAllHooks.size(); ++i) {
        Hook h = kAllHooks[i];
        INFO(name_of(h));
        CHECK(env.run(h, in).retval == retval_of(Verdict::pass, h));
        // The old entry steps aside (hands every packet to the entry program).
        CHECK(raw_run(old[i].get(), in, is_xdp(h)).retval == retval_of(Verdict::pass, h));
    }
    // A program step's parameters are read from the table: no new entries for those.
    Env rate(chain_of({step(MPS_ACT_RATE_LIMIT)}));
    int before = rate.generation().entry_fd(Hook::tc_egress);
    rate.set_step(0, act_rate(1000, 1000, 2000));
    CHECK(rate.generation().entry_fd(Hook::tc_egress) == before);
}

TEST_CASE("compiled entries: chains with more inline steps than fit stay with the interpreter",
          "[bpf][compiled]") {
    auto selectors_then_drop = [](uint16_t n) {
        std::vector<mps_step> s;
        for (uint16_t i = 0; i < n; ++i)
            s.push_back(sel_port(PortDir::either, 0, 65535, i + 1, END));
        s.push_back(step(MPS_ACT_DROP));
        return chain_of(s);
    };
    Env env(selectors_then_drop(mpsteer::datapath::kCompiledMaxSteps));
    Bytes in = Packet::v4("10.1.0.1", 40000, "10.2.0.1", 80).payload(4).build();
    for (Hook h : kAllHooks) {
        CHECK_FALSE(env.generation().compiled(h));
        CHECK(env.run(h, in).retval == retval_of(Verdict::drop, h));
    }
    Env fits(selectors_then_drop(mpsteer::datapath::kCompiledMaxSteps - 1));  // 16 steps
    for (Hook h : kAllHooks) {
        CHECK(fits.generation().compiled(h));
        CHECK(fits.run(h, in).retval == retval_of(Verdict::drop, h));
    }
}

TEST_CASE("compiled entries: the verifier's work stays small on the most tangled chain that fits",
          "[bpf][compiled]") {
    // Every selector goes on to the next two steps (paths double at each), packet_type steps
    // reached with and without the option walk, a program step at the end.
    std::vector<mps_step> s;
    const uint16_t n = mpsteer::datapath::kCompiledMaxSteps - 1;
    for (uint16_t i = 0; i < n; ++i) {
        const uint16_t m = i + 1, miss = std::min<uint16_t>(i + 2, n);
        s.push_back(i % 3 == 1   ? sel_kinds(MPS_K_DSS << (i % 5), m, miss)
                    : i % 3 == 2 ? sel_port(PortDir::either, 1000 + i, 6000, m, miss)
                                 : sel_src("10.1.0.0/" + std::to_string(8 + i), m, miss));
    }
    s.push_back(step(MPS_ACT_RECORD));
    Env env(chain_of(s));
    // The kernel's limit is 1,000,000. Measured: ~39k on 6.12 and 6.18; 669k on 6.1, whose
    // verifier prunes few of the paths the chain doubles at each selector (tests/vm/run.sh
    // amd64 6.1 bpf), so the bound there only keeps the entry clear of the limit.
    utsname u{};
    uname(&u);
    int major = 0, minor = 0;
    std::sscanf(u.release, "%d.%d", &major, &minor);
    const uint32_t bound = major > 6 || (major == 6 && minor >= 12) ? 100000 : 800000;
    for (Hook h : kAllHooks) {
        INFO(name_of(h) << " on " << u.release);
        REQUIRE(env.generation().compiled(h));
        bpf_prog_info info{};
        uint32_t len = sizeof info;
        REQUIRE(bpf_obj_get_info_by_fd(env.generation().entry_fd(h), &info, &len) == 0);
        WARN("verified instructions: " << info.verified_insns);
        CHECK(info.verified_insns < bound);
    }
}

TEST_CASE(
    "the benchmark's floor programs take the benchmark's frame and nothing that fails a check",
    "[bpf][compiled]") {
    // bench_floor_* stand for the least a chain of the benchmark's selectors must read and
    // check: each check must hold, or the figure measures less than that.
    PinRoot root;
    auto state = dp::StateMaps::open(root.path());
    auto g = dp::Generation::build(chain_of({step(MPS_ACT_PASS)}), 1, state,
                                   {"bench_floor_match", "bench_floor_nomatch"});
    const int match = g->prog_fd("bench_floor_match"), nomatch = g->prog_fd("bench_floor_nomatch");
    auto frame = [](std::string_view dst = "10.0.1.2", uint16_t dport = 5201) {
        return Packet::v4("10.0.1.1", 40000, dst, dport)
            .option(opt::nop())
            .option(opt::nop())
            .option(opt::timestamps(1, 2))
            .option(mt::dss(mt::Dss().ack(7)))
            .payload(100);
    };
    CHECK(raw_run(match, dp::mptcp_data_frame(), true).retval == XDP_PASS_);
    CHECK(raw_run(match, frame().build(), true).retval == XDP_PASS_);
    CHECK(raw_run(nomatch, dp::mptcp_data_frame(), true).retval == XDP_PASS_);
    const auto aborted = uint32_t(XDP_ABORTED);
    auto fragment = frame();
    fragment.v4h().frag = 0x2000;
    auto options = frame();
    options.v4h().options = {1, 1, 1, 1};
    auto udp = frame();
    udp.v4h().protocol = 17;
    auto truncated = frame();
    truncated.truncate = 30;  // within the IPv4 header
    for (auto& [what, p] : std::vector<std::pair<std::string, Packet>>{{"a fragment", fragment},
                                                                       {"IPv4 options", options},
                                                                       {"not TCP", udp},
                                                                       {"cut short", truncated}}) {
        INFO(what);
        CHECK(raw_run(match, p.build(), true).retval == aborted);
        CHECK(raw_run(nomatch, p.build(), true).retval == aborted);
    }
    CHECK(raw_run(nomatch, frame("10.9.0.7").build(), true).retval == aborted);  // its miss
    CHECK(raw_run(match, frame("10.0.2.2").build(), true).retval == aborted);
    CHECK(raw_run(match, frame("10.0.1.2", 5202).build(), true).retval == aborted);
    auto no_dss = Packet::v4("10.0.1.1", 40000, "10.0.1.2", 5201)
                      .option(opt::nop())
                      .option(opt::nop())
                      .option(opt::timestamps(1, 2))
                      .option(mt::mp_prio_v0(true, 1))
                      .payload(10);
    CHECK(raw_run(match, no_dss.build(), true).retval == aborted);
    auto dss_then_nops =
        frame().option(opt::nop()).option(opt::nop()).option(opt::nop()).option(opt::nop());
    CHECK(raw_run(match, dss_then_nops.build(), true).retval == aborted);
}
