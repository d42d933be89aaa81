// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Stateless selectors, table-driven: each case runs "selector -> (match) act_drop / (miss) end"
// through the XDP and the TC egress entry and checks the verdict, that the frame comes out
// byte for byte as it went in, and the step and generation counters.
#include <catch2/catch.hpp>

#include "bpf_env.h"
#include "compile/compile.h"
#include "manifest/manifest.h"

using namespace mpsteer::test;

namespace {

struct SelCase {
    std::string name;
    mps_step sel;
    Packet pkt;
    bool match;
};

constexpr const char* C4 = "10.1.0.1";
constexpr const char* S4 = "10.2.0.2";
constexpr const char* C6 = "2001:db8:1::1";
constexpr const char* S6 = "2001:db8:2::2";

Packet fwd4() {
    return Packet::v4(C4, 40000, S4, 80).payload(10);
}
Packet rev4() {
    return Packet::v4(S4, 80, C4, 40000).payload(10);
}
Packet fwd6() {
    return Packet::v6(C6, 40000, S6, 80).payload(10);
}
Packet rev6() {
    return Packet::v6(S6, 80, C6, 40000).payload(10);
}

// One generation per table: step 0 is rewritten for every case (see Env::set_step).
class Prober {
public:
    Prober() : env_(probe(sel_port(PortDir::either, 0, 65535))) {}
    void run(const SelCase& c) {
        mps_step sel = c.sel;
        sel.on_match = 1;
        sel.on_miss = END;
        env_.set_step(0, sel);
        Bytes in = c.pkt.build();
        INFO("case: " << c.name);
        REQUIRE(verify_checksums(in));
        for (Hook h : kCaseHooks) {
            INFO("hook: " << name_of(h));
            Snap before = Snap::of(env_);
            Run r = env_.run(h, in);
            Snap after = Snap::of(env_);
            CHECK(r.retval == retval_of(c.match ? Verdict::drop : Verdict::pass, h));
            if (r.out != in) FAIL_CHECK("frame modified\n" << describe_frame(r.out, in));
            auto s0 = step_delta(before, after, 0), s1 = step_delta(before, after, 1);
            const uint64_t n = counted(sel) ? 1 : 0;  // inline selectors keep no counters
            CHECK(s0.runs == n);
            CHECK(s0.matched == (c.match ? n : 0u));
            CHECK(s1.runs == (c.match ? 1u : 0u));
            CHECK(s1.drops == (c.match ? 1u : 0u));
            CHECK(gen_delta(before, after, MPS_GC_PACKETS) == 1);
            CHECK(gen_delta(before, after, MPS_GC_MALFORMED) == 0);
            CHECK(gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL) == 0);
            CHECK(gen_delta(before, after, MPS_GC_NOT_TCP) == 0);
        }
    }
    void run_all(const std::vector<SelCase>& t) {
        for (const auto& c : t) run(c);
    }

private:
    Env env_;
};

}  // namespace

// The step the compiler makes of one selector of a manifest (its first step).
mps_step compiled_selector(const std::string& selector) {
    mpsteer::manifest::Options o;
    o.check_scripts = false;
    auto r = mpsteer::manifest::load_sources(
        {{"t.yaml",
          "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n"
          "  attach: {hooks: [xdp]}\n  priority: 1\n  select:\n    - " +
              selector + "\n  actions:\n    - drop: {}\n"}},
        o);
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    return mpsteer::compile::compile(r.model).chains.steps.at(0);
}

// fwd4()/fwd6() with the IP header's TOS (traffic class) and TTL (hop limit) set.
Packet with_ip(Packet p, uint8_t tos, uint8_t ttl) {
    if (p.is_v6()) {
        p.v6h().tclass = tos;
        p.v6h().hop_limit = ttl;
    } else {
        p.v4h().tos = tos;
        p.v4h().ttl = ttl;
    }
    return p;
}

TEST_CASE("match tests on the IP header's word: TOS and TTL, IPv4 and IPv6", "[bpf][selector]") {
    auto ttl = [](uint32_t lo, uint32_t hi) {
        return dp::Match().test(MPS_W_IP, 0xff, lo, hi).step(END);
    };
    auto tos = [](uint32_t v) {
        return dp::Match().test(MPS_W_IP, 0xff00, v << 8, v << 8).step(END);
    };
    std::vector<SelCase> t;
    for (bool v6 : {false, true}) {
        const std::string f = v6 ? "v6 " : "v4 ";
        const Packet p = v6 ? fwd6() : fwd4();
        t.push_back({f + "TTL 1 in 1-5", ttl(1, 5), with_ip(p, 0, 1), true});
        t.push_back({f + "TTL 5 in 1-5", ttl(1, 5), with_ip(p, 0, 5), true});
        t.push_back({f + "TTL 64 not in 1-5", ttl(1, 5), with_ip(p, 0, 64), false});
        t.push_back({f + "TTL 0 not in 1-5", ttl(1, 5), with_ip(p, 0xff, 0), false});
        t.push_back({f + "TOS 0xb9 exact", tos(0xb9), with_ip(p, 0xb9, 64), true});
        t.push_back({f + "TOS 0xb8 is not 0xb9", tos(0xb9), with_ip(p, 0xb8, 64), false});
        t.push_back({f + "TOS is not the TTL", tos(64), with_ip(p, 0, 64), false});
    }
    Prober pr;
    pr.run_all(t);
}

TEST_CASE("selectors as the compiler lowers a manifest's", "[bpf][selector]") {
    const std::string sub6 = std::string("subflow: {a: {address: '") + C6 +
                             "', port: 40000}, b: {address: '" + S6 + "', port: 80}}";
    std::vector<SelCase> t = {
        {"dst in the prefix", compiled_selector("dst: 10.2.0.0/16"), fwd4(), true},
        {"dst outside the prefix", compiled_selector("dst: 10.3.0.0/16"), fwd4(), false},
        {"v6 src /64", compiled_selector("src: 2001:db8:1::/64"), fwd6(), true},
        {"v6 src /64, a v4 packet", compiled_selector("src: 2001:db8:1::/64"), fwd4(), false},
        {"port either, the reverse", compiled_selector("port: {either: 80}"), rev4(), true},
        {"port src 80, forward", compiled_selector("port: {src: 80}"), fwd4(), false},
        {"v6 subflow forward", compiled_selector(sub6), fwd6(), true},
        {"v6 subflow reverse", compiled_selector(sub6), rev6(), true},
        {"v6 subflow, other port", compiled_selector(sub6),
         Packet::v6(C6, 40001, S6, 80).payload(10), false},
    };
    for (bool v6 : {false, true}) {
        const std::string f = v6 ? "v6 " : "v4 ";
        const Packet p = v6 ? fwd6() : fwd4();
        const mps_step ttl = compiled_selector("ttl: \"1-5\""),
                       dscp = compiled_selector("dscp: 46");
        t.push_back({f + "ttl 1 in 1-5", ttl, with_ip(p, 0, 1), true});
        t.push_back({f + "ttl 6 not in 1-5", ttl, with_ip(p, 0, 6), false});
        t.push_back({f + "dscp 46 (EF), ECN 0", dscp, with_ip(p, 46 << 2, 64), true});
        t.push_back({f + "dscp 46 (EF), ECN 3", dscp, with_ip(p, 46 << 2 | 3, 64), true});
        t.push_back({f + "dscp 47 is not 46", dscp, with_ip(p, 47 << 2, 64), false});
        t.push_back({f + "dscp 0 with TTL 46 is not 46", dscp, with_ip(p, 0, 46), false});
    }
    Prober pr;
    pr.run_all(t);
}

TEST_CASE("selector subflow (4-tuple, either direction)", "[bpf][selector]") {
    std::vector<SelCase> t = {
        {"v4 forward", sel_subflow(C4, 40000, S4, 80), fwd4(), true},
        {"v4 reverse", sel_subflow(C4, 40000, S4, 80), rev4(), true},
        {"v4 endpoints given the other way round", sel_subflow(S4, 80, C4, 40000), fwd4(), true},
        {"v4 wrong source port", sel_subflow(C4, 40001, S4, 80), fwd4(), false},
        {"v4 wrong destination port", sel_subflow(C4, 40000, S4, 81), fwd4(), false},
        {"v4 ports crossed", sel_subflow(C4, 80, S4, 40000), fwd4(), false},
        {"v4 wrong address", sel_subflow("10.1.0.3", 40000, S4, 80), fwd4(), false},
        {"v4 tagged 802.1ad + 802.1Q", sel_subflow(C4, 40000, S4, 80),
         fwd4().vlan(0x88a8, 100).vlan(0x8100, 200), true},
        {"v6 forward", sel_subflow(C6, 40000, S6, 80), fwd6(), true},
        {"v6 reverse", sel_subflow(C6, 40000, S6, 80), rev6(), true},
        {"v6 wrong port", sel_subflow(C6, 40000, S6, 443), fwd6(), false},
        {"v6 address differs in the last byte", sel_subflow("2001:db8:1::2", 40000, S6, 80), fwd6(),
         false},
        {"v6 address differs in the first word", sel_subflow("3001:db8:1::1", 40000, S6, 80),
         fwd6(), false},
        {"v4 step, v6 packet", sel_subflow(C4, 40000, S4, 80), fwd6(), false},
        {"v6 step, v4 packet", sel_subflow("::ffff:10.1.0.1", 40000, "::ffff:10.2.0.2", 80), fwd4(),
         false},
    };
    Prober().run_all(t);
}

TEST_CASE("selector ip_pair (addresses, any ports, either direction)", "[bpf][selector]") {
    std::vector<SelCase> t = {
        {"v4 forward", sel_ip_pair(C4, S4), fwd4(), true},
        {"v4 reverse", sel_ip_pair(C4, S4), rev4(), true},
        {"v4 other ports", sel_ip_pair(C4, S4), Packet::v4(C4, 1, S4, 2), true},
        {"v4 one address differs", sel_ip_pair(C4, "10.2.0.3"), fwd4(), false},
        {"v4 both addresses are the source", sel_ip_pair(C4, C4), fwd4(), false},
        {"v6 forward", sel_ip_pair(C6, S6), fwd6(), true},
        {"v6 reverse behind hop-by-hop", sel_ip_pair(C6, S6),
         [] {
             Packet p = rev6();
             p.v6h().ext = {hop_by_hop()};
             return p;
         }(),
         true},
        {"v6 one address differs", sel_ip_pair(C6, "2001:db8:2::3"), fwd6(), false},
        {"v4 step, v6 packet", sel_ip_pair(C4, S4), fwd6(), false},
        {"v6 step, v4 packet", sel_ip_pair(C6, S6), fwd4(), false},
    };
    Prober().run_all(t);
}

TEST_CASE("selector src (CIDR)", "[bpf][selector]") {
    std::vector<SelCase> t = {
        {"v4 /8", sel_src("10.0.0.0/8"), fwd4(), true},
        {"v4 /32 exact", sel_src("10.1.0.1/32"), fwd4(), true},
        {"v4 /32 off by one", sel_src("10.1.0.2/32"), fwd4(), false},
        {"v4 /0 matches every v4", sel_src("0.0.0.0/0"), fwd4(), true},
        {"v4 /20 inside", sel_src("10.1.15.0/20"), fwd4(), true},
        {"v4 /20 outside", sel_src("10.1.16.0/20"), fwd4(), false},
        {"v4 /31 odd prefix", sel_src("10.1.0.0/31"), fwd4(), true},
        {"v4 /31 odd prefix, next pair", sel_src("10.1.0.2/31"), fwd4(), false},
        {"v4 the destination does not count", sel_src("10.2.0.0/16"), fwd4(), false},
        {"v4 reverse packet: its source", sel_src("10.2.0.0/16"), rev4(), true},
        {"v4 behind IP options", sel_src("10.1.0.0/16"),
         [] {
             Packet p = fwd4();
             p.v4h().options = {1, 1, 1, 0};
             return p;
         }(),
         true},
        {"v6 /64", sel_src("2001:db8:1::/64"), fwd6(), true},
        {"v6 /128 exact", sel_src("2001:db8:1::1/128"), fwd6(), true},
        {"v6 /128 off by one", sel_src("2001:db8:1::/128"), fwd6(), false},
        {"v6 /0", sel_src("::/0"), fwd6(), true},
        {"v6 /65: bit 65 differs", sel_src("2001:db8:1:0:8000::/65"), fwd6(), false},
        {"v6 /65: bit 65 equal", sel_src("2001:db8:1::/65"), fwd6(), true},
        {"v6 /127 across the last word", sel_src("2001:db8:1::/127"), fwd6(), true},
        {"v6 the destination does not count", sel_src("2001:db8:2::/48"), fwd6(), false},
        {"v6 behind routing + destination options", sel_src("2001:db8:1::/48"),
         [] {
             Packet p = fwd6();
             p.v6h().ext = {routing(), dest_opts()};
             return p;
         }(),
         true},
        {"v4 /0 does not match v6", sel_src("0.0.0.0/0"), fwd6(), false},
        {"v6 /0 does not match v4", sel_src("::/0"), fwd4(), false},
    };
    Prober().run_all(t);
}

TEST_CASE("selector dst (CIDR)", "[bpf][selector]") {
    std::vector<SelCase> t = {
        {"v4 /16", sel_dst("10.2.0.0/16"), fwd4(), true},
        {"v4 /32 exact", sel_dst("10.2.0.2/32"), fwd4(), true},
        {"v4 /32 off by one", sel_dst("10.2.0.3/32"), fwd4(), false},
        {"v4 /0", sel_dst("0.0.0.0/0"), fwd4(), true},
        {"v4 /23 boundary inside", sel_dst("10.2.1.0/23"), fwd4(), true},
        {"v4 /23 boundary outside", sel_dst("10.2.2.0/23"), fwd4(), false},
        {"v4 the source does not count", sel_dst("10.1.0.0/16"), fwd4(), false},
        {"v4 reverse packet: its destination", sel_dst("10.1.0.0/16"), rev4(), true},
        {"v4 one VLAN tag", sel_dst("10.2.0.0/16"), fwd4().vlan(0x8100, 7), true},
        {"v6 /48", sel_dst("2001:db8:2::/48"), fwd6(), true},
        {"v6 /128 exact", sel_dst("2001:db8:2::2/128"), fwd6(), true},
        {"v6 /128 off by one", sel_dst("2001:db8:2::3/128"), fwd6(), false},
        {"v6 /33: bit 33 differs", sel_dst("2001:db8:8000::/33"), fwd6(), false},
        {"v6 /96 in the third word", sel_dst("2001:db8:2::/96"), fwd6(), true},
        {"v6 the source does not count", sel_dst("2001:db8:1::/48"), fwd6(), false},
        {"v6 behind hop-by-hop", sel_dst("2001:db8:2::/48"),
         [] {
             Packet p = fwd6();
             p.v6h().ext = {hop_by_hop()};
             return p;
         }(),
         true},
        {"v4 prefix on v6", sel_dst("10.2.0.0/16"), fwd6(), false},
        {"v6 prefix on v4", sel_dst("::/0"), fwd4(), false},
    };
    Prober().run_all(t);
}

TEST_CASE("selector port (range, direction)", "[bpf][selector]") {
    std::vector<SelCase> t;
    for (bool v6 : {false, true}) {
        std::string f = v6 ? "v6 " : "v4 ";
        Packet p = v6 ? fwd6() : fwd4();  // 40000 -> 80
        t.push_back({f + "src exact", sel_port(PortDir::src, 40000, 40000), p, true});
        t.push_back({f + "src range low edge", sel_port(PortDir::src, 40000, 50000), p, true});
        t.push_back({f + "src range high edge", sel_port(PortDir::src, 30000, 40000), p, true});
        t.push_back({f + "src below", sel_port(PortDir::src, 40001, 50000), p, false});
        t.push_back({f + "src above", sel_port(PortDir::src, 30000, 39999), p, false});
        t.push_back(
            {f + "src range holds the dst port only", sel_port(PortDir::src, 80, 80), p, false});
        t.push_back({f + "dst exact", sel_port(PortDir::dst, 80, 80), p, true});
        t.push_back({f + "dst miss", sel_port(PortDir::dst, 81, 65535), p, false});
        t.push_back({f + "dst range holds the src port only", sel_port(PortDir::dst, 40000, 40000),
                     p, false});
        t.push_back({f + "either by src", sel_port(PortDir::either, 40000, 40000), p, true});
        t.push_back({f + "either by dst", sel_port(PortDir::either, 1, 80), p, true});
        t.push_back({f + "either miss", sel_port(PortDir::either, 81, 39999), p, false});
        t.push_back({f + "full range", sel_port(PortDir::either, 0, 65535), p, true});
        t.push_back({f + "empty range (lo > hi)", sel_port(PortDir::either, 90, 70), p, false});
    }
    t.push_back(
        {"port 0 and 65535", sel_port(PortDir::src, 0, 0), Packet::v4(C4, 0, S4, 65535), true});
    t.push_back({"port 65535 dst", sel_port(PortDir::dst, 65535, 65535),
                 Packet::v4(C4, 0, S4, 65535), true});
    Prober().run_all(t);
}

// ---- packet_type ----------------------------------------------------------------------------

namespace {

struct KindCase {
    std::string name;
    uint32_t mask;
    Packet match;                    // carries the kind
    std::optional<Packet> no_match;  // closest packet without it
};

Packet base(bool v6, uint8_t flags = tcpf::ACK) {
    Packet p = v6 ? Packet::v6(C6, 40000, S6, 80) : Packet::v4(C4, 40000, S4, 80);
    return p.flags(flags);
}

std::vector<KindCase> kind_cases(bool v6) {
    using namespace mptcp;
    auto b = [v6](uint8_t f = tcpf::ACK) { return base(v6, f); };
    auto ts = opt::timestamps(100, 200);
    std::vector<KindCase> t = {
        {"MP_CAPABLE on a SYN (len 4)", MPS_K_MP_CAPABLE,
         b(tcpf::SYN).option(opt::mss(1460)).option(capable_syn()),
         b(tcpf::SYN).option(opt::mss(1460))},
        {"MP_CAPABLE len 12", MPS_K_MP_CAPABLE,
         b(tcpf::SYN | tcpf::ACK).option(capable_synack(0x0102030405060708)),
         b(tcpf::SYN | tcpf::ACK).option(join_synack(1, 2))},
        {"MP_CAPABLE len 20", MPS_K_MP_CAPABLE, b().option(capable_ack(1, 2)),
         b().option(dss(Dss().ack(1)))},
        {"MP_CAPABLE len 24 with data", MPS_K_MP_CAPABLE,
         b().option(capable({1, 0x81, 1, 2, 10, 0x1234})).payload(10), std::nullopt},
        {"MP_JOIN SYN", MPS_K_MP_JOIN, b(tcpf::SYN).option(join_syn(0xdeadbeef, 7)),
         b(tcpf::SYN).option(capable_syn())},
        {"MP_JOIN SYN/ACK", MPS_K_MP_JOIN, b(tcpf::SYN | tcpf::ACK).option(join_synack(9, 7)),
         std::nullopt},
        {"MP_JOIN third ACK", MPS_K_MP_JOIN, b().option(join_ack({})), std::nullopt},
        // Lengths the kernel does not parse (mptcp_parse_option() ignores the option), while
        // a well-formed option beside it still counts.
        {"MP_CAPABLE beside a 3-byte MP_JOIN", MPS_K_MP_CAPABLE,
         b(tcpf::SYN).option(opt::raw(30, {0x10})).option(capable_syn()),
         b(tcpf::SYN).option(opt::raw(30, {0x10})).option(capable_ack(1, 2))},
        {"MP_JOIN SYN, not a 3-byte one", MPS_K_MP_JOIN, b(tcpf::SYN).option(join_syn(1, 2)),
         b(tcpf::SYN).option(opt::raw(30, {0x10})).option(capable_syn())},
        {"MP_JOIN ACK, not of the SYN's length", MPS_K_MP_JOIN, b().option(join_ack({})),
         b().option(join_syn(1, 2))},
        {"MP_CAPABLE ACK (20), not of the SYN's length (4)", MPS_K_MP_CAPABLE,
         b().option(capable_ack(1, 2)), b().option(capable_syn())},
        {"MP_CAPABLE with data is 22 or 24, not 20", MPS_K_MP_CAPABLE,
         b().option(capable({1, 0x81, 1, 2, 10, {}})).payload(10),
         b().option(capable_ack(1, 2)).payload(10)},
        {"ANY_MPTCP: a malformed MP_JOIN alone is not MPTCP", MPS_K_PLAIN_TCP,
         b().option(opt::raw(30, {0x10})), b().option(join_ack({}))},
        {"DSS data ack only", MPS_K_DSS, b().option(dss(Dss().ack(5))),
         b().option(add_addr(ip4("10.9.0.1"), 1))},
        {"DSS mapping with checksum", MPS_K_DSS,
         b().option(dss(Dss().map(1, 1, 10).csum(0))).payload(10), std::nullopt},
        {"DSS after NOPs and timestamps", MPS_K_DSS,
         b().option(opt::nop()).option(opt::nop()).option(ts).option(dss(Dss().ack(1, false))),
         b().option(opt::nop()).option(opt::nop()).option(ts)},
        {"DATA_ACK (A flag)", MPS_K_DATA_ACK, b().option(dss(Dss().ack(5, false).map(1, 1, 0))),
         b().option(dss(Dss().map(1, 1, 0)))},
        {"DATA_ACK 8 bytes", MPS_K_DATA_ACK, b().option(dss(Dss().ack(5))), std::nullopt},
        {"DATA_FIN (F flag)", MPS_K_DATA_FIN, b().option(dss(Dss().ack(5).map(1, 0, 1).fin())),
         b().option(dss(Dss().ack(5).map(1, 0, 1)))},
        {"ADD_ADDR v4 with port", MPS_K_ADD_ADDR, b().option(add_addr(ip4("10.9.0.1"), 1, 8080)),
         b().option(remove_addr({1}))},
        {"ADD_ADDR v6 echo, second MPTCP option", MPS_K_ADD_ADDR,
         b().option(dss(Dss().ack(1))).option(add_addr(ip6("2001:db8:9::1"), 2, {}, true)),
         b().option(dss(Dss().ack(1)))},
        {"ADD_ADDR v6 with port and HMAC", MPS_K_ADD_ADDR,
         b().option(add_addr(ip6("2001:db8:9::1"), 2, 443, false, 0x1122334455667788)),
         std::nullopt},
        {"REMOVE_ADDR", MPS_K_REMOVE_ADDR, b().option(remove_addr({1, 2})), b().option(mp_fail(3))},
        {"MP_PRIO v1 (len 3)", MPS_K_MP_PRIO, b().option(mp_prio(true)).option(opt::nop()),
         b().option(dss(Dss().ack(1)))},
        {"MP_PRIO v0 (len 4)", MPS_K_MP_PRIO, b().option(mp_prio_v0(false, 3)), std::nullopt},
        {"MP_FAIL", MPS_K_MP_FAIL, b().option(mp_fail(0x1234)), b().option(fastclose(1))},
        {"FASTCLOSE", MPS_K_FASTCLOSE, b().option(fastclose(0xabcdef)), b().option(mp_fail(1))},
        {"MP_TCPRST", MPS_K_MP_TCPRST, b(tcpf::RST | tcpf::ACK).option(tcprst(1, 2)),
         b(tcpf::RST | tcpf::ACK)},
        {"ANY_MPTCP", MPS_K_ANY_MPTCP, b().option(add_addr(ip4("10.9.0.1"), 1)), b().option(ts)},
        {"ANY_MPTCP: unknown subtype 0xf", MPS_K_ANY_MPTCP, b().option(opt::raw(30, {0xf0, 0})),
         std::nullopt},
        {"PLAIN_TCP with common options", MPS_K_PLAIN_TCP,
         b(tcpf::SYN)
             .option(opt::mss(1460))
             .option(opt::sack_perm())
             .option(ts)
             .option(opt::nop())
             .option(opt::wscale(7)),
         b(tcpf::SYN).option(opt::mss(1460)).option(capable_syn())},
        {"PLAIN_TCP without options", MPS_K_PLAIN_TCP, b(), b().option(dss(Dss()))},
        {"SYN", MPS_K_SYN, b(tcpf::SYN), b()},
        {"SYN/ACK is a SYN", MPS_K_SYN, b(tcpf::SYN | tcpf::ACK), std::nullopt},
        {"FIN", MPS_K_FIN, b(tcpf::FIN | tcpf::ACK), b()},
        {"RST", MPS_K_RST, b(tcpf::RST), b()},
        {"ACK", MPS_K_ACK, b(tcpf::ACK | tcpf::PSH).payload(1), b(tcpf::SYN)},
        {"PAYLOAD", MPS_K_PAYLOAD, b().payload(1), b()},
        {"TIMESTAMP", MPS_K_TIMESTAMP, b().option(opt::nop()).option(opt::nop()).option(ts),
         b().option(opt::raw(8, {1, 2, 3, 4, 5, 6}))},  // kind 8 of the wrong length
        {"any_of: ADD_ADDR | REMOVE_ADDR", MPS_K_ADD_ADDR | MPS_K_REMOVE_ADDR,
         b().option(remove_addr({4})), b().option(dss(Dss().ack(1)))},
        {"options after EOL are not read", MPS_K_ANY_MPTCP,
         b().option(opt::nop()).option(mp_fail(1)).option(opt::eol()),
         b().option(opt::nop()).option(opt::eol()).option(mp_fail(1))},
    };
    return t;
}

}  // namespace

TEST_CASE("selector packet_type: every kind, IPv4 and IPv6", "[bpf][selector]") {
    Prober pr;
    for (bool v6 : {false, true}) {
        for (const KindCase& k : kind_cases(v6)) {
            std::string fam = v6 ? "v6 " : "v4 ";
            pr.run({fam + k.name + " (match)", sel_kinds(k.mask), k.match, true});
            if (k.no_match)
                pr.run({fam + k.name + " (no match)", sel_kinds(k.mask), *k.no_match, false});
        }
    }
}

TEST_CASE("selector packet_type: every kind bit is told apart", "[bpf][selector]") {
    // One packet per kind; a selector for kind X must match exactly the packets carrying X.
    // Checked on one generation per kind through XDP (the TC program shares the walk).
    using namespace mptcp;
    struct K {
        uint32_t bit;
        Packet p;
    };
    std::vector<K> ks = {
        {MPS_K_MP_CAPABLE, base(false, tcpf::SYN).option(capable_syn())},
        {MPS_K_MP_JOIN, base(false, tcpf::SYN).option(join_syn(1, 2))},
        {MPS_K_DSS, base(false).option(dss(Dss().map(1, 1, 0)))},
        {MPS_K_ADD_ADDR, base(false).option(add_addr(ip4("1.2.3.4"), 1))},
        {MPS_K_REMOVE_ADDR, base(false).option(remove_addr({1}))},
        {MPS_K_MP_PRIO, base(false).option(mp_prio_v0(true, 1))},
        {MPS_K_MP_FAIL, base(false).option(mp_fail(1))},
        {MPS_K_FASTCLOSE, base(false).option(fastclose(1))},
        {MPS_K_MP_TCPRST, base(false).option(tcprst(0, 0))},
    };
    Env env(probe(sel_kinds(0)));
    for (size_t j = 0; j < ks.size(); j++) {
        env.set_step(0, sel_kinds(ks[j].bit, 1, END));
        for (size_t n = 0; n < ks.size(); n++) {
            CAPTURE(j, n);
            Run r = env.run(Hook::xdp, ks[n].p);
            bool want = ks[n].bit == ks[j].bit;
            CHECK(r.retval == retval_of(want ? Verdict::drop : Verdict::pass, Hook::xdp));
        }
    }
}
