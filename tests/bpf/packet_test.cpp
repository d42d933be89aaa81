// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Tests of the packet builder and checksum verifier the datapath tests rely on (no privileges).
#include <catch2/catch.hpp>

#include "packet.h"

using namespace mpsteer::test;

namespace {

// An independent TCP checksum for the known-answer checks: 32-bit words summed as written in
// RFC 1071 §4.1's C example, over an explicitly laid out pseudo-header.
uint16_t reference_tcp_csum(const Bytes& pseudo, const Bytes& seg) {
    Bytes all = pseudo;
    all.insert(all.end(), seg.begin(), seg.end());
    if (all.size() % 2) all.push_back(0);
    uint64_t sum = 0;
    for (size_t i = 0; i < all.size(); i += 2) sum += (all[i] << 8) + all[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return uint16_t(~sum & 0xffff);
}

std::vector<Packet> sample_packets() {
    std::vector<Packet> v;
    v.push_back(Packet::v4("10.0.0.1", 40000, "10.0.1.2", 80)
                    .flags(tcpf::SYN)
                    .option(opt::mss(1460))
                    .option(opt::sack_perm())
                    .option(opt::timestamps(1, 0))
                    .option(opt::nop())
                    .option(opt::wscale(7))
                    .option(mptcp::capable_syn()));
    v.push_back(Packet::v4("192.168.1.1", 1, "192.168.1.2", 2)
                    .vlan(0x88a8, 10)
                    .vlan(0x8100, 20)
                    .option(mptcp::dss(mptcp::Dss().ack(5).map(77, 1, 3)))
                    .payload(3));
    Packet o = Packet::v4("172.16.0.1", 5, "172.16.0.9", 6).payload(1);
    o.v4h().options = {0x94, 0x04, 0, 0};  // router alert
    v.push_back(o);
    v.push_back(
        Packet::v6("2001:db8::1", 443, "2001:db8:1::2", 50000)
            .option(mptcp::add_addr(ip6("2001:db8:2::1"), 3, 8080, false, 0x1122334455667788))
            .payload(17));
    Packet e = Packet::v6("fe80::1", 9, "fe80::2", 10).payload(2);
    e.v6h().ext = {hop_by_hop(), routing(), dest_opts({1, 2, 0, 0})};
    v.push_back(e);
    return v;
}

}  // namespace

TEST_CASE("RFC 1071 example sums to ddf2", "[packet]") {
    Bytes b{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7};
    CHECK(csum_fold(csum_add(0, b)) == uint16_t(~0xddf2));
    // odd length: the last byte is the high half of a word
    Bytes odd{0x12};
    CHECK(csum_fold(csum_add(0, odd)) == uint16_t(~0x1200));
}

TEST_CASE("IPv4 header checksum: known answer", "[packet]") {
    // The classic example header 4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7.
    Packet p = Packet::v4("192.168.0.1", 1, "192.168.0.199", 2);
    p.v4h().id = 0;
    p.v4h().protocol = 0x11;
    p.v4h().tot_len = 0x73;
    Bytes f = p.build();
    Bytes hdr(f.begin() + 14, f.begin() + 34);
    Bytes want{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
               0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
    CHECK(hdr == want);
}

TEST_CASE("TCP checksum agrees with an independent computation (v4 and v6)", "[packet]") {
    Packet p4 = Packet::v4("10.1.2.3", 1234, "10.9.8.7", 80).seq(0x01020304).payload(7, 0x5a);
    Bytes f4 = p4.build();
    Bytes seg4(f4.begin() + 34, f4.end());
    uint16_t got4 = get16(seg4, 16);
    seg4[16] = seg4[17] = 0;
    Bytes ph4{10, 1, 2, 3, 10, 9, 8, 7, 0, 6, 0, uint8_t(seg4.size())};
    CHECK(got4 == reference_tcp_csum(ph4, seg4));

    Packet p6 = Packet::v6("2001:db8::1", 1234, "2001:db8::2", 80).payload(3, 0xa5);
    Bytes f6 = p6.build();
    Bytes seg6(f6.begin() + 54, f6.end());
    uint16_t got6 = get16(seg6, 16);
    seg6[16] = seg6[17] = 0;
    Bytes ph6;
    auto s = ip6("2001:db8::1"), d = ip6("2001:db8::2");
    ph6.insert(ph6.end(), s.begin(), s.end());
    ph6.insert(ph6.end(), d.begin(), d.end());
    put32(ph6, uint32_t(seg6.size()));
    put32(ph6, 6);
    CHECK(got6 == reference_tcp_csum(ph6, seg6));
}

TEST_CASE("Routing header with segments left: pseudo-header uses the final destination",
          "[packet]") {
    auto final_dst = ip6("2001:db8:ff::9");
    Packet p = Packet::v6("2001:db8::1", 1, "2001:db8::2", 2).payload(4);
    p.v6h().ext = {routing(0, 1, {final_dst})};
    Bytes f = p.build();
    REQUIRE(verify_checksums(f));
    auto loc = locate(f);
    REQUIRE(loc);
    Bytes seg(f.begin() + long(loc->l4), f.end());
    uint16_t got = get16(seg, 16);
    seg[16] = seg[17] = 0;
    Bytes ph;
    auto s = ip6("2001:db8::1");
    ph.insert(ph.end(), s.begin(), s.end());
    ph.insert(ph.end(), final_dst.begin(), final_dst.end());
    put32(ph, uint32_t(seg.size()));
    put32(ph, 6);
    CHECK(got == reference_tcp_csum(ph, seg));
}

TEST_CASE("Built frames verify; any single corrupted covered byte is caught", "[packet]") {
    auto pkts = sample_packets();
    for (size_t n = 0; n < pkts.size(); n++) {
        CAPTURE(n);
        Bytes f = pkts[n].build();
        INFO(hexdump(f));
        REQUIRE(checksum_errors(f) == "");
        auto loc = locate(f);
        REQUIRE(loc);
        for (size_t i = loc->l3; i < f.size(); i++) {
            if (loc->family == 6 && i < loc->l3 + 8 && i != loc->l3 + 4 && i != loc->l3 + 5 &&
                i != loc->l3 + 6)
                continue;  // version/class/flow label and hop limit: not covered in IPv6
            if (loc->family == 6 && i >= loc->l3 + 40 && i < loc->l4)
                continue;  // extension headers: not covered (length bytes move the TCP header)
            Bytes g = f;
            g[i] ^= 0x5a;
            CAPTURE(i);
            CHECK_FALSE(verify_checksums(g));
        }
        for (size_t i = 0; i < loc->l3; i++) {  // Ethernet: not covered
            Bytes g = f;
            g[i] ^= 0x5a;
            if (i >= 12) continue;  // changing the type or a tag changes what is parsed
            CHECK(verify_checksums(g));
        }
    }
}

TEST_CASE("Layout: Ethernet, VLAN tags, IPv4 options, IPv6 extension headers", "[packet]") {
    auto pkts = sample_packets();
    Bytes f1 = pkts[1].build();
    CHECK(get16(f1, 12) == 0x88a8);
    CHECK(get16(f1, 14) == 10);
    CHECK(get16(f1, 16) == 0x8100);
    CHECK(get16(f1, 18) == 20);
    CHECK(get16(f1, 20) == 0x0800);
    auto l1 = locate(f1);
    REQUIRE(l1);
    CHECK(l1->l3 == 22);
    CHECK(l1->l4 == 42);

    Bytes f2 = pkts[2].build();
    CHECK(f2[14] == 0x46);  // ihl 6 with the 4-byte option
    CHECK(get16(f2, 16) == 24 + 20 + 1);
    CHECK(locate(f2)->l4 == 14 + 24);

    Bytes f4 = pkts[4].build();
    CHECK(f4[14 + 6] == 0);  // first: hop-by-hop
    CHECK(f4[54] == 43);     // hop-by-hop -> routing
    CHECK(f4[55] == 0);      // 8 bytes
    CHECK(f4[62] == 60);     // routing -> destination options
    CHECK(f4[70] == 6);      // destination options -> TCP
    CHECK(get16(f4, 18) == 24 + 20 + 2);
    CHECK(locate(f4)->l4 == 54 + 24);

    Packet fr = Packet::v6("::1", 1, "::2", 2);
    fr.v6h().ext = {fragment6(0, true, 7)};
    Bytes ff = fr.build();
    CHECK(ff[20] == 44);
    Bytes want{6, 0, 0x00, 0x01, 0, 0, 0, 7};
    CHECK(Bytes(ff.begin() + 54, ff.begin() + 62) == want);
}

TEST_CASE("TCP header fields and option padding", "[packet]") {
    Packet p = Packet::v4("1.1.1.1", 0x1234, "2.2.2.2", 0x5678)
                   .seq(0xa1b2c3d4)
                   .ack(0x01020304)
                   .flags(tcpf::ACK | tcpf::PSH)
                   .window(0x4321)
                   .option(opt::wscale(9));  // 3 bytes -> padded to 4 with EOL
    Bytes f = p.build();
    size_t t = 34;
    CHECK(get16(f, t) == 0x1234);
    CHECK(get16(f, t + 2) == 0x5678);
    CHECK(get32(f, t + 4) == 0xa1b2c3d4);
    CHECK(get32(f, t + 8) == 0x01020304);
    CHECK(f[t + 12] == 6 << 4);
    CHECK(f[t + 13] == 0x18);
    CHECK(get16(f, t + 14) == 0x4321);
    CHECK(Bytes(f.begin() + 54, f.end()) == Bytes{3, 3, 9, 0});
    CHECK(opt::timestamps(0x01020304, 0x05060708) == Bytes{8, 10, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(opt::mss(1460) == Bytes{2, 4, 0x05, 0xb4});
    CHECK(opt::raw(30, {0x20}, 1) == Bytes{30, 1, 0x20});
}

TEST_CASE("MPTCP options: layout and lengths from RFC 8684", "[packet]") {
    using namespace mptcp;
    CHECK(capable_syn() == Bytes{30, 4, 0x01, 0x01});
    CHECK(capable_syn(0, 0x81) == Bytes{30, 4, 0x00, 0x81});
    CHECK(capable_synack(0x0102030405060708) == Bytes{30, 12, 0x01, 0x01, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(capable_ack(0x1111111111111111, 0x2222222222222222).size() == 20);
    CHECK(capable({1, 0x81, 1, 2, 0x0102, {}}).size() == 22);
    Bytes c24 = capable({1, 0x81, 1, 2, 0x0102, 0xbeef});
    CHECK(c24.size() == 24);
    CHECK(c24[1] == 24);
    CHECK(Bytes(c24.begin() + 20, c24.end()) == Bytes{1, 2, 0xbe, 0xef});

    CHECK(join_syn(0xaabbccdd, 0x01020304, 5, true) ==
          Bytes{30, 12, 0x11, 5, 0xaa, 0xbb, 0xcc, 0xdd, 1, 2, 3, 4});
    Bytes sa = join_synack(0x0102030405060708, 0x0a0b0c0d, 2);
    CHECK(sa == Bytes{30, 16, 0x10, 2, 1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d});
    std::array<uint8_t, 20> h{};
    h[19] = 0x99;
    Bytes ja = join_ack(h);
    CHECK(ja.size() == 24);
    CHECK(ja[1] == 24);
    CHECK(ja[2] == 0x10);
    CHECK(ja[23] == 0x99);

    // DSS: flags byte and the length of each combination
    CHECK(dss(Dss()) == Bytes{30, 4, 0x20, 0x00});
    CHECK(dss(Dss().ack(0x01020304, false)) == Bytes{30, 8, 0x20, 0x01, 1, 2, 3, 4});
    CHECK(dss(Dss().ack(1)).size() == 12);
    CHECK(dss(Dss().ack(1))[3] == 0x03);
    CHECK(dss(Dss().map(1, 0, 0, false)).size() == 14);
    CHECK(dss(Dss().map(1, 0, 0, false))[3] == 0x04);
    CHECK(dss(Dss().map(1, 0, 0)).size() == 18);
    CHECK(dss(Dss().map(1, 0, 0))[3] == 0x0c);
    CHECK(dss(Dss().ack(1).map(1, 0, 0)).size() == 26);
    CHECK(dss(Dss().ack(1).map(1, 0, 0).csum(0)).size() == 28);
    CHECK(dss(Dss().ack(1, false).map(1, 0, 0, false)).size() == 18);
    Bytes fin = dss(Dss().ack(1).map(0x0a0b, 0x0c0d0e0f, 0x1234).fin());
    CHECK(fin[3] == 0x1f);
    CHECK(Bytes(fin.begin() + 12, fin.end()) ==
          Bytes{0, 0, 0, 0, 0, 0, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x12, 0x34});

    auto a4 = ip4("10.0.0.7");
    auto a6 = ip6("2001:db8::7");
    CHECK(add_addr(a4, 1).size() == 16);
    CHECK(add_addr(a4, 1, 80).size() == 18);
    CHECK(add_addr(a4, 1, {}, true).size() == 8);
    CHECK(add_addr(a4, 1, 80, true).size() == 10);
    CHECK(add_addr(a6, 1).size() == 28);
    CHECK(add_addr(a6, 1, 80).size() == 30);
    CHECK(add_addr(a6, 1, {}, true).size() == 20);
    CHECK(add_addr(a6, 1, 80, true).size() == 22);
    CHECK(add_addr(a4, 9, 0x1f90, false, 0x0102030405060708) ==
          Bytes{30, 18, 0x30, 9, 10, 0, 0, 7, 0x1f, 0x90, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(add_addr(a4, 9, {}, true) == Bytes{30, 8, 0x31, 9, 10, 0, 0, 7});

    CHECK(remove_addr({3}) == Bytes{30, 4, 0x40, 3});
    CHECK(remove_addr({3, 4, 5}) == Bytes{30, 6, 0x40, 3, 4, 5});
    CHECK(mp_prio(true) == Bytes{30, 3, 0x51});
    CHECK(mp_prio(false) == Bytes{30, 3, 0x50});
    CHECK(mp_prio_v0(true, 4) == Bytes{30, 4, 0x51, 4});
    CHECK(mp_fail(0x0102030405060708) == Bytes{30, 12, 0x60, 0, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(fastclose(0x0102030405060708) == Bytes{30, 12, 0x70, 0, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(tcprst(0x1, 0x05) == Bytes{30, 4, 0x81, 0x05});
}

TEST_CASE("Malformed builds: overrides land where they should", "[packet]") {
    Packet p = Packet::v4("10.0.0.1", 1, "10.0.0.2", 2).payload(10);
    p.v4h().ihl = 4;
    p.v4h().tot_len = 0x0fff;
    p.v4h().frag = 0x2000;
    p.tcp.doff = 3;
    p.tcp.checksum = 0xdead;
    Bytes f = p.build();
    CHECK(f[14] == 0x44);
    CHECK(get16(f, 16) == 0x0fff);
    CHECK(get16(f, 20) == 0x2000);
    CHECK(f[34 + 12] == 0x30);
    CHECK(get16(f, 34 + 16) == 0xdead);
    CHECK_FALSE(locate(f));  // ihl < 5
    CHECK_FALSE(checksum_errors(f).empty());

    Packet t = Packet::v6("::1", 1, "::2", 2).payload(10);
    t.truncate = 60;
    CHECK(t.build().size() == 60);
    CHECK_FALSE(locate(t.build()));  // payload length runs past the frame

    Packet v = Packet::v4("10.0.0.1", 1, "10.0.0.2", 2);
    v.v4h().version = 6;
    CHECK(v.build()[14] >> 4 == 6);

    Packet e = Packet::v6("::1", 1, "::2", 2);
    e.v6h().ext = {hop_by_hop()};
    e.v6h().ext[0].hdr_len = 200;
    CHECK(e.build()[55] == 200);
}

TEST_CASE("reversed() swaps the 4-tuple", "[packet]") {
    Packet p =
        Packet::v6("2001:db8::1", 1000, "2001:db8::2", 80).seq(5).ack(9).option(mptcp::mp_prio(1));
    Packet r = p.reversed();
    CHECK(r.v6h().src == ip6("2001:db8::2"));
    CHECK(r.v6h().dst == ip6("2001:db8::1"));
    CHECK(r.tcp.sport == 80);
    CHECK(r.tcp.dport == 1000);
    CHECK(r.tcp.seq == 9);
    CHECK(r.tcp.ack == 5);
    CHECK(r.tcp.options.empty());
    CHECK(verify_checksums(r.build()));
}
