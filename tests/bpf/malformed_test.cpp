// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Malformed input: every frame below must come out of every chain without a guard (no step with
// failure mode drop) untouched with PASS, counted as malformed (or as not TCP), whatever the
// chain would have done to a well-formed packet — including chains whose actors modify packets
// (rate_limit) and end in a drop. Under a guard such frames are dropped (the last test cases).
#include <catch2/catch.hpp>

#include "bpf_env.h"

using namespace mpsteer::test;

namespace {

enum class Counted { malformed, not_tcp };

struct BadCase {
    std::string name;
    Bytes frame;
    Counted counted;
    bool
        at_entry;  // found by the entry program (no step runs) or by the first step reading options
    // BPF_PROG_TEST_RUN refuses it for TC programs (EINVAL: the kernel wants a whole IPv4
    // header in an skb, v4 and v6); XDP still runs it.
    bool tc_refused = false;
};

constexpr const char* C4 = "10.1.0.1";
constexpr const char* S4 = "10.2.0.2";
constexpr const char* C6 = "2001:db8:1::1";
constexpr const char* S6 = "2001:db8:2::2";

Packet client(bool v6) {
    return v6 ? Packet::v6(C6, 40000, S6, 80) : Packet::v4(C4, 40000, S4, 80);
}

// The well-formed packet every malformed one is derived from: an ACK with a large window,
// timestamps and data, on a flow whose handshake the datapath has seen.
Packet good(bool v6) {
    return client(v6)
        .seq(5001)
        .ack(9001)
        .window(60000)
        .option(opt::nop())
        .option(opt::nop())
        .option(opt::timestamps(1000, 2000))
        .payload(20);
}

std::vector<Packet> handshake(bool v6) {
    Packet syn = client(v6)
                     .flags(tcpf::SYN)
                     .seq(5000)
                     .option(opt::mss(1460))
                     .option(opt::wscale(7))
                     .option(mptcp::capable_syn());
    Packet synack = syn.reversed();
    synack.flags(tcpf::SYN | tcpf::ACK)
        .seq(9000)
        .ack(5001)
        .option(opt::mss(1460))
        .option(opt::wscale(2))
        .option(mptcp::capable_synack(0x1111222233334444));
    return {syn, synack};
}

Packet with_options(bool v6, Bytes opts) {
    Packet p = good(v6);
    p.tcp.options = std::move(opts);
    return p;
}

std::vector<BadCase> bad_cases(bool v6) {
    std::vector<BadCase> t;
    std::string f = v6 ? "v6 " : "v4 ";
    auto add = [&](std::string n, const Packet& p, Counted c, bool entry) {
        t.push_back({f + n, p.build(), c, entry});
    };
    using C = Counted;
    // TCP options (found by the first step that walks them)
    add("option length 0", with_options(v6, {1, 1, 8, 0}), C::malformed, false);
    add("option length 1", with_options(v6, {3, 1, 7, 1}), C::malformed, false);
    add("option length 0 after valid options",
        with_options(v6, {1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 4, 0, 1, 1}), C::malformed, false);
    add("timestamps running past doff", with_options(v6, {1, 1, 8, 10}), C::malformed, false);
    add("DSS running past doff", with_options(v6, {30, 20, 0x20, 0x01, 0, 0, 0, 1}), C::malformed,
        false);
    add("MPTCP option of length 2", with_options(v6, {1, 1, 30, 2}), C::malformed, false);
    add("kind in the last byte, length outside the header", with_options(v6, {1, 1, 1, 8}),
        C::malformed, false);
    // TCP header
    {
        Packet p = good(v6);
        p.tcp.doff = 4;
        add("doff 4 (< 5)", p, C::malformed, true);
        p.tcp.doff = 0;
        add("doff 0", p, C::malformed, true);
        Packet q = client(v6);
        q.tcp.doff = 15;
        add("doff 15 beyond the IP length", q, C::malformed, true);
    }
    {
        Packet p = good(v6);
        size_t l4 = v6 ? 54 : 34;
        p.truncate = l4 + 10;
        add("truncated inside the TCP header", p, C::malformed, true);
        p.truncate = l4 + 30;
        add("truncated inside the payload", p, C::malformed, true);
        p.truncate = l4 - 8;
        add("truncated inside the IP header", p, C::malformed, true);
        t.back().tc_refused = true;
    }
    if (!v6) {
        Packet p = good(false);
        p.v4h().ihl = 4;
        add("ihl 4 (< 5)", p, C::malformed, true);
        p.v4h().ihl = 0;
        add("ihl 0", p, C::malformed, true);
        Packet q = good(false);
        q.v4h().ihl = 15;
        add("ihl 15 beyond the frame", q, C::malformed, true);
        Packet r = good(false);
        r.v4h().tot_len = 30;
        add("tot_len shorter than IP + TCP headers", r, C::malformed, true);
        Packet s = good(false);
        s.v4h().tot_len = 1500;
        add("tot_len longer than the frame", s, C::malformed, true);
        Packet v = good(false);
        v.v4h().version = 5;
        add("version 5 in an IPv4 frame", v, C::malformed, true);
        Packet mf = good(false);
        mf.v4h().frag = 0x2000;
        add("first fragment (MF)", mf, C::not_tcp, true);
        Packet off = good(false);
        off.v4h().frag = 185;
        add("later fragment (offset 185)", off, C::not_tcp, true);
        Packet last = good(false);
        last.v4h().frag = 0x4000 | 1;
        add("last fragment with DF (offset 1)", last, C::not_tcp, true);
        Packet udp = good(false);
        udp.v4h().protocol = 17;
        add("UDP", udp, C::not_tcp, true);
        Packet opts = good(false);
        opts.v4h().options = {0x44, 12, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // a timestamp option
        opts.v4h().frag = 0x2000;
        add("fragment behind IP options", opts, C::not_tcp, true);
    } else {
        Packet p = good(true);
        p.v6h().payload_len = 1400;
        add("payload length longer than the frame", p, C::malformed, true);
        Packet q = good(true);
        q.v6h().payload_len = 10;
        add("payload length shorter than the TCP header", q, C::malformed, true);
        Packet e = good(true);
        e.v6h().ext = {hop_by_hop()};
        e.v6h().ext[0].hdr_len = 20;
        add("hop-by-hop length past the payload", e, C::malformed, true);
        Packet v = good(true);
        v.eth.ethertype = 0x86dd;
        Bytes b = v.build();
        b[14] = uint8_t(0x40 | (b[14] & 0x0f));
        t.push_back({f + "version 4 in an IPv6 frame", b, C::malformed, true});
        Packet fr = good(true);
        fr.v6h().ext = {fragment6(0, true)};
        add("fragment header", fr, C::not_tcp, true);
        Packet fr2 = good(true);
        fr2.v6h().ext = {hop_by_hop(), fragment6(0, true)};
        add("hop-by-hop then fragment header", fr2, C::not_tcp, true);
        Packet deep = good(true);
        deep.v6h().ext = {hop_by_hop(), dest_opts(), routing(), dest_opts(), dest_opts()};
        add("five extension headers (deeper than the walk)", deep, C::not_tcp, true);
        Packet udp = good(true);
        udp.v6h().next = 17;
        add("UDP", udp, C::not_tcp, true);
    }
    {
        Packet p = good(v6);
        p.eth.vlans = {{0x8100, 5}};
        p.truncate = 16;
        add("truncated VLAN tag", p, C::malformed, true);
        Packet arp = good(v6);
        arp.eth.ethertype = 0x0806;
        add("ARP ethertype", arp, C::not_tcp, true);
    }
    return t;
}

struct NamedChain {
    std::string name;
    std::vector<mps_step> steps;
};

std::vector<NamedChain> chains() {
    return {
        {"packet_type(any) -> drop",
         {sel_kinds(MPS_K_ANY_MPTCP | MPS_K_PLAIN_TCP, 1), step(MPS_ACT_DROP)}},
        {"rate_limit -> drop", {act_rate(1000, 10000, 0, 1), step(MPS_ACT_DROP)}},
        {"rate_limit alone", {act_rate(1000, 10000, 0)}},
        {"record -> get_connect -> get_subflow -> rate_limit -> drop",
         {step(MPS_ACT_RECORD, 1), step(MPS_ACT_GET_CONNECT, 2), step(MPS_ACT_GET_SUBFLOW, 3),
          act_rate(1000, 10000, 0, 4), step(MPS_ACT_DROP)}},
        {"port -> sequence(data) -> flow_bytes -> rate_limit",
         {sel_port(PortDir::either, 0, 65535, 1), sel_seq(MPS_SEQ_DATA, 0, ~0ull, 2, 2),
          sel_bytes(MPS_BYTES_SUBFLOW, 0, ~0ull, 3, 3), act_rate(1000, 10000, 0)}},
    };
}

}  // namespace

TEST_CASE("malformed input passes untouched through every chain", "[bpf][malformed]") {
    for (const auto& ch : chains()) {
        INFO("chain: " << ch.name);
        Env env(chain_of(ch.steps));
        bool ends_in_drop = ch.steps.back().prog == MPS_ACT_DROP;
        for (bool v6 : {false, true}) {
            for (Hook h : kCaseHooks) {
                INFO("hook: " << name_of(h));
                for (const Packet& p : handshake(v6)) env.run(h, p);
                // Control: the chain is live, a well-formed packet is dropped where it ends
                // in a drop.
                if (ends_in_drop) {
                    Run ok = env.run(h, good(v6).build());
                    CHECK(ok.retval == retval_of(Verdict::drop, h));
                }
                for (const BadCase& c : bad_cases(v6)) {
                    INFO("case: " << c.name);
                    if (c.tc_refused && !is_xdp(h)) {
                        CHECK_THROWS(env.run(h, c.frame));
                        continue;
                    }
                    Snap before = Snap::of(env);
                    Run r = env.run(h, c.frame);
                    Snap after = Snap::of(env);
                    CHECK(r.retval == retval_of(Verdict::pass, h));
                    if (r.out != c.frame)
                        FAIL_CHECK("frame modified\n" << describe_frame(r.out, c.frame));
                    CHECK(gen_delta(before, after, MPS_GC_PACKETS) == 1);
                    CHECK(gen_delta(before, after, MPS_GC_MALFORMED) ==
                          (c.counted == Counted::malformed ? 1u : 0u));
                    CHECK(gen_delta(before, after, MPS_GC_NOT_TCP) ==
                          (c.counted == Counted::not_tcp ? 1u : 0u));
                    CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
                    uint64_t runs = 0, drops = 0;
                    for (size_t pc = 0; pc < ch.steps.size(); pc++) {
                        runs += step_delta(before, after, pc).runs;
                        drops += step_delta(before, after, pc).drops;
                    }
                    CHECK(drops == 0);
                    if (c.at_entry) CHECK(runs == 0);
                }
            }
        }
    }
}

TEST_CASE("a SYN with malformed options teaches the flow nothing", "[bpf][malformed]") {
    Env env(chain_of({step(MPS_ACT_RECORD, 1), step(MPS_ACT_PASS)}));
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Packet syn = client(v6).flags(tcpf::SYN).option(opt::wscale(7)).option({8, 0, 1, 1});
            syn.tcp.sport = uint16_t(h == Hook::xdp ? 41000 : 42000);
            Bytes in = syn.build();
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(Verdict::pass, h));
            CHECK(r.out == in);
            CHECK(gen_delta(before, after, MPS_GC_MALFORMED) == 1);
            CHECK(step_delta(before, after, 0).runs == 0);
            CHECK_FALSE(env.flow(syn));
        }
    }
}

// Under a guard (a step with failure mode drop that the packet could still reach), what the
// datapath cannot read is dropped: garbage must not walk around the guard. Linux itself
// accepts such packets (it stops parsing at a bad option; it reassembles fragments).
TEST_CASE("unparseable packets are dropped where a drop-on-failure guard could decide them",
          "[bpf][malformed][guard]") {
    // port 80 -> packet_type(MP_JOIN) -> drop, the selector and the drop with failure mode drop
    std::vector<mps_step> guarded = {sel_port(PortDir::either, 80, 80, 1, END),
                                     sel_kinds(MPS_K_MP_JOIN, 2, END), step(MPS_ACT_DROP)};
    guarded[1].flags |= MPS_STEPF_FAIL_DROP;
    guarded[2].flags |= MPS_STEPF_FAIL_DROP;
    std::vector<mps_step> open = guarded;
    for (auto& s : open) s.flags = 0;
    for (bool is_guarded : {true, false}) {
        Env env(chain_of(is_guarded ? guarded : open));
        for (bool v6 : {false, true}) {
            for (Hook h : kCaseHooks) {
                INFO((is_guarded ? "guarded " : "open ") << (v6 ? "v6 " : "v4 ") << name_of(h));
                Packet syn = client(v6)
                                 .flags(tcpf::SYN)
                                 .option(mptcp::join_syn(7, 1))
                                 .option({8, 0, 1, 1});  // MP_JOIN, then a bad option
                Packet frag = good(v6).option(mptcp::join_ack({}));
                if (v6)
                    frag.v6h().ext = {fragment6(0, true)};
                else
                    frag.v4h().frag = 0x2000;  // MF
                Packet later = good(v6);
                if (v6)
                    later.v6h().ext = {fragment6(185, false)};
                else
                    later.v4h().frag = 185;
                struct Case {
                    const char* name;
                    Bytes frame;
                    mps_gen_counter counter;
                };
                for (const Case& c : {Case{"SYN with a bad option", syn.build(), MPS_GC_MALFORMED},
                                      Case{"ACK with a bad option",
                                           with_options(v6, {30, 24, 0x10, 0, 1, 1, 8, 0}).build(),
                                           MPS_GC_MALFORMED},
                                      Case{"first fragment", frag.build(), MPS_GC_NOT_TCP},
                                      Case{"later fragment", later.build(), MPS_GC_NOT_TCP}}) {
                    INFO(c.name);
                    Snap before = Snap::of(env);
                    Run r = env.run(h, c.frame);
                    Snap after = Snap::of(env);
                    CHECK(r.retval == retval_of(is_guarded ? Verdict::drop : Verdict::pass, h));
                    CHECK(r.out == c.frame);
                    CHECK(gen_delta(before, after, c.counter) == 1);
                    CHECK(gen_delta(before, after, MPS_GC_UNPARSEABLE_DROPS) ==
                          (is_guarded ? 1u : 0u));
                }
                // Not TCP: not ours, whatever the guard.
                Packet udp = good(v6);
                if (v6) {
                    udp.v6h().ext = {fragment6(0, true)};
                    udp.v6h().next = 17;
                } else {
                    udp.v4h().frag = 0x2000;
                    udp.v4h().protocol = 17;
                }
                Bytes u = udp.build();
                CHECK(env.run(h, u).retval == retval_of(Verdict::pass, h));
                // A well-formed packet the guard does not select passes.
                CHECK(env.run(h, good(v6)).retval == retval_of(Verdict::pass, h));
            }
        }
    }
}

TEST_CASE("add_subflow hands a packet it cannot read to the guard behind it, as every step does",
          "[bpf][malformed][guard]") {
    // add_subflow -> packet_type(MP_JOIN) (fail drop) -> drop: add_subflow is the first step to
    // walk the options, so the bad one is found there.
    std::vector<mps_step> s = {step(MPS_ACT_ADD_SUBFLOW, 1), sel_kinds(MPS_K_MP_JOIN, 2, END),
                               step(MPS_ACT_DROP)};
    s[1].flags |= MPS_STEPF_FAIL_DROP;
    for (bool guarded : {true, false}) {
        if (!guarded) s[1].flags &= ~MPS_STEPF_FAIL_DROP;
        Env env(chain_of(s));
        for (Hook h : {Hook::tc_egress, Hook::tc_ingress}) {
            INFO((guarded ? "guarded " : "open ") << name_of(h));
            Bytes in = with_options(false, {30, 24, 0x10, 0, 1, 1, 8, 0}).build();
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(guarded ? Verdict::drop : Verdict::pass, h));
            CHECK(r.out == in);
            CHECK(gen_delta(before, after, MPS_GC_MALFORMED) == 1);
            CHECK(gen_delta(before, after, MPS_GC_UNPARSEABLE_DROPS) == (guarded ? 1u : 0u));
            CHECK(env.steps()[1].runs == 0);  // the selector never saw it
        }
    }
}

TEST_CASE("a guard behind another policy's steps still covers unparseable packets",
          "[bpf][malformed][guard]") {
    // record (fail pass) -> port 9 (fail pass) -> drop (fail drop): the entry step is guarded
    std::vector<mps_step> s = {step(MPS_ACT_RECORD, 1), sel_port(PortDir::dst, 9, 9, 2, END),
                               step(MPS_ACT_DROP)};
    s[2].flags |= MPS_STEPF_FAIL_DROP;
    Env env(chain_of(s));
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Packet frag = good(false);
        frag.v4h().frag = 0x2000;  // MF
        Bytes in = frag.build();
        Run r = env.run(h, in);
        CHECK(r.retval == retval_of(Verdict::drop, h));
        CHECK(r.out == in);
        CHECK(env.gen().values[MPS_GC_UNPARSEABLE_DROPS] >= 1);
    }
}
