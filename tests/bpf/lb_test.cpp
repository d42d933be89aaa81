// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The MPTCP-aware load balancer's datapath (bpf/lb.bpf.c) through BPF_PROG_TEST_RUN, driven by
// lb::Balancer: new connections by the Maglev table the C++ side builds (same flow hash),
// third ACKs turned into tokens, joins to their token's owner whatever their hash says, an
// unknown token dropped or answered with an exact reset, backends added and drained.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/bpf.h>

#include <cstring>
#include <string>
#include <vector>

#include "datapath/datapath.h"
#include "lb/balancer.h"
#include "packet.h"

using namespace mpsteer;
using namespace mpsteer::test;

namespace {

constexpr uint32_t kIngress = 1;  // the interface frames arrive on (lo): XDP_TX goes back out
constexpr uint16_t kPort = 443;
const char* const kVip4 = "203.0.113.10";
const char* const kVip6 = "2001:db8:113::10";

struct Run {
    uint32_t action = 0;
    Bytes out;
};

Run run(const lb::Balancer& b, const Bytes& frame) {
    Bytes out(frame.size() + 256);
    xdp_md ctx{};
    ctx.data_end = static_cast<uint32_t>(frame.size());
    ctx.ingress_ifindex = kIngress;
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = out.data(),
                .data_size_in = static_cast<uint32_t>(frame.size()),
                .data_size_out = static_cast<uint32_t>(out.size()), .ctx_in = &ctx,
                .ctx_size_in = sizeof ctx, .repeat = 1);
    if (bpf_prog_test_run_opts(b.prog_fd(), &opts) != 0)
        throw std::runtime_error(std::string("test run: ") + std::strerror(errno));
    out.resize(opts.data_size_out);
    return {opts.retval, out};
}

lb::Mac mac_of(uint8_t last) {
    return {0x02, 0xbb, 0, 0, 0, last};
}
const lb::Mac kBalancerMac{0x02, 0xaa, 0, 0, 0, 1};

lb::Target backend(const std::string& name, uint8_t mac_last, uint32_t ifindex = kIngress,
                   bool draining = false) {
    lb::Target t;
    t.backend = {name, 1, draining};
    t.mac = mac_of(mac_last);
    t.src_mac = kBalancerMac;
    t.ifindex = ifindex;
    return t;
}

lb::Service service(const char* vip, mps_lb_unknown_action a = MPS_LB_UNKNOWN_DROP) {
    lb::Service s;
    s.family = std::strchr(vip, ':') ? 6 : 4;
    REQUIRE(inet_pton(s.family == 4 ? AF_INET : AF_INET6, vip, s.addr.data()) == 1);
    s.port = kPort;
    s.unknown_token = a;
    return s;
}

// The balancer as the tests use it: two VIPs, three backends b1..b3 (MAC ...:01..03).
struct Fixture {
    lb::Balancer b{lb::Sizes{4096, 4096, 251}};
    std::vector<lb::Target> targets{backend("b1", 1), backend("b2", 2), backend("b3", 3)};
    Fixture(mps_lb_unknown_action a = MPS_LB_UNKNOWN_DROP) {
        b.set_services({service(kVip4, a), service(kVip6, a)});
        b.set_backends(targets);
    }
    // The backend the C++ Maglev table gives a client's flow to the VIP.
    std::string hashed(const Packet& p, const std::vector<lb::Target>& ts) const {
        std::vector<lb::Backend> bs;
        for (const auto& t : ts) bs.push_back(t.backend);
        auto table = lb::maglev_table(bs, 251);
        Bytes f = p.build();
        const bool v6 = p.is_v6();
        const size_t l3 = 14, alen = v6 ? 16 : 4, at = v6 ? l3 + 8 : l3 + 12;
        const size_t l4 = l3 + (v6 ? 40 : 20);
        auto tuple = lb::flow_tuple({f.data() + at, alen}, {f.data() + at + alen, alen},
                                    uint16_t(f[l4] << 8 | f[l4 + 1]),
                                    uint16_t(f[l4 + 2] << 8 | f[l4 + 3]), 6);
        return ts[table[lb::slot_of(lb::flow_hash(tuple), 251)]].backend.name;
    }
    std::string hashed(const Packet& p) const { return hashed(p, targets); }
};

// Which backend a forwarded frame went to (by its destination MAC); "" when not forwarded.
std::string sent_to(const Run& r) {
    if (r.action != XDP_TX || r.out.size() < 12) return "";
    if (!std::equal(kBalancerMac.begin(), kBalancerMac.end(), r.out.begin() + 6)) return "";
    lb::Mac m;
    std::copy(r.out.begin(), r.out.begin() + 6, m.begin());
    for (uint8_t i = 1; i <= 9; ++i)
        if (m == mac_of(i)) return "b" + std::to_string(i);
    return "?";
}

Packet syn(const char* src, uint16_t sport, const char* vip) {
    Packet p = std::strchr(vip, ':') ? Packet::v6(src, sport, vip, kPort)
                                     : Packet::v4(src, sport, vip, kPort);
    p.flags(tcpf::SYN).option(opt::mss(1460)).option(mptcp::capable_syn());
    return p;
}

Packet third_ack(const char* src, uint16_t sport, const char* vip, uint64_t server_key) {
    Packet p = std::strchr(vip, ':') ? Packet::v6(src, sport, vip, kPort)
                                     : Packet::v4(src, sport, vip, kPort);
    p.flags(tcpf::ACK).option(mptcp::capable_ack(0x1111222233334444ull, server_key));
    return p;
}

Packet join(const char* src, uint16_t sport, const char* vip, uint32_t token) {
    Packet p = std::strchr(vip, ':') ? Packet::v6(src, sport, vip, kPort)
                                     : Packet::v4(src, sport, vip, kPort);
    p.flags(tcpf::SYN).option(mptcp::join_syn(token, 0xabcdef01));
    return p;
}

uint32_t token_of(uint64_t key) {
    uint64_t wire = htobe64(key);
    return datapath::mptcp_key_ids(wire).token;
}

}  // namespace

TEST_CASE("lb: new connections go to the backend of their Maglev slot, v4 and v6", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    for (const char* vip : {kVip4, kVip6}) {
        INFO(vip);
        const char* client = std::strchr(vip, ':') ? "2001:db8:1::5" : "198.51.100.5";
        std::map<std::string, int> spread;
        for (uint16_t port = 40000; port < 40300; ++port) {
            Packet p = syn(client, port, vip);
            Run r = run(fx.b, p.build());
            const std::string want = fx.hashed(p);
            REQUIRE(sent_to(r) == want);
            ++spread[want];
            // Only the MACs changed.
            Bytes in = p.build();
            REQUIRE(r.out.size() == in.size());
            CHECK(std::equal(in.begin() + 12, in.end(), r.out.begin() + 12));
        }
        CHECK(spread.size() == 3);
        for (auto& [name, n] : spread) CHECK(n > 60);  // 300 flows over 3 backends
    }
    auto c = fx.b.counters();
    CHECK(c[MPS_LB_C_NEW_FLOWS] == 600);
    CHECK(c[MPS_LB_C_PACKETS] == 600);
}

TEST_CASE("lb: packets that are not for a VIP pass untouched", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    for (Packet p : {Packet::v4("198.51.100.5", 40000, "203.0.113.11", kPort),
                     Packet::v4("198.51.100.5", 40000, kVip4, 80),
                     Packet::v6("2001:db8:1::5", 40000, "2001:db8:113::11", kPort)}) {
        Run r = run(fx.b, p.flags(tcpf::SYN).build());
        CHECK(r.action == XDP_PASS);
        CHECK(r.out == p.build());
    }
    CHECK(fx.b.counters()[MPS_LB_C_PACKETS] == 0);
}

TEST_CASE("lb: a third ACK's server key becomes its backend's token; joins follow the token",
          "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    for (const char* vip : {kVip4, kVip6}) {
        INFO(vip);
        const bool v6 = std::strchr(vip, ':');
        const char* c1 = v6 ? "2001:db8:1::5" : "198.51.100.5";
        const char* c2 = v6 ? "2001:db8:2::5" : "198.51.101.5";
        const uint64_t key = v6 ? 0x0123456789abcdefull : 0xfedcba9876543210ull;
        std::string owner = sent_to(run(fx.b, syn(c1, 41000, vip).build()));
        REQUIRE(!owner.empty());
        CHECK(sent_to(run(fx.b, third_ack(c1, 41000, vip, key).build())) == owner);
        REQUIRE(fx.b.learn(std::chrono::milliseconds(100)) == 1);
        const uint32_t token = token_of(key);
        CHECK(fx.b.owner_of(token) == fx.b.index_of(owner));

        // Joins from the client's second address, on ports the hash gives to other backends.
        int routed_against_hash = 0;
        for (uint16_t port = 42000; port < 42030; ++port) {
            Packet j = join(c2, port, vip, token);
            CHECK(sent_to(run(fx.b, j.build())) == owner);
            if (fx.hashed(j) != owner) {
                ++routed_against_hash;
                // The join's later packets stay with it.
                Packet data = j;
                data.tcp.options.clear();
                data.flags(tcpf::ACK).payload(100);
                CHECK(sent_to(run(fx.b, data.build())) == owner);
            }
        }
        CHECK(routed_against_hash > 10);
    }
    auto c = fx.b.counters();
    CHECK(c[MPS_LB_C_JOINS_ROUTED] == 60);
    CHECK(c[MPS_LB_C_KEYS_SEEN] == 2);
    CHECK(c[MPS_LB_C_JOINS_UNKNOWN] == 0);
}

TEST_CASE("lb: a join with an unknown token is dropped, and reaches no backend", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    for (uint32_t token : {0x12345678u, 0u, 0xffffffffu}) {
        Run r = run(fx.b, join("198.51.100.9", 43000, kVip4, token).build());
        CHECK(r.action == XDP_DROP);
        r = run(fx.b, join("2001:db8:1::9", 43000, kVip6, token).build());
        CHECK(r.action == XDP_DROP);
    }
    CHECK(fx.b.counters()[MPS_LB_C_JOINS_UNKNOWN] == 6);
    // Nor did the forged joins leave an entry their later packets could follow.
    Packet later = Packet::v4("198.51.100.9", 43000, kVip4, kPort);
    later.payload(10);
    run(fx.b, later.build());
    CHECK(fx.b.counters()[MPS_LB_C_FLOW_HITS] == 0);
}

TEST_CASE("lb: a join with an unknown token is answered with the exact reset", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx(MPS_LB_UNKNOWN_RESET);
    for (const char* vip : {kVip4, kVip6}) {
        INFO(vip);
        const char* client = std::strchr(vip, ':') ? "2001:db8:1::9" : "198.51.100.9";
        Packet j = join(client, 43000, vip, 0x12345678);
        j.seq(7000).payload(3);
        Run r = run(fx.b, j.build());
        REQUIRE(r.action == XDP_TX);
        Packet want = j.reversed();
        want.eth.dst = j.eth.src;
        want.eth.src = j.eth.dst;
        want.flags(tcpf::RST | tcpf::ACK).seq(0).ack(7000 + 1 + 3).window(0);
        if (want.is_v6())
            want.v6h().hop_limit = 64;
        else {
            want.v4h().ttl = 64;
            want.v4h().id = j.v4h().id;
        }
        CHECK(r.out == want.build());  // both checksums included
    }
}

TEST_CASE("lb: a backend added takes new flows only; a drained one keeps its flows", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    // 200 connections established on three backends.
    std::vector<std::pair<Packet, std::string>> before;
    for (uint16_t port = 44000; port < 44200; ++port) {
        Packet p = syn("198.51.100.7", port, kVip4);
        before.push_back({p, sent_to(run(fx.b, p.build()))});
    }
    auto four = fx.targets;
    four.push_back(backend("b4", 4));
    fx.b.set_backends(four);
    int moved_by_hash = 0;
    for (auto& [p, was] : before) {
        Packet data = p;
        data.tcp.options.clear();
        data.flags(tcpf::ACK).payload(50);
        CHECK(sent_to(run(fx.b, data.build())) == was);  // its entry, not the new hash
        moved_by_hash += fx.hashed(p, four) != was;
    }
    CHECK(moved_by_hash > 20);  // the table did move them: the entries kept them
    std::map<std::string, int> fresh;
    for (uint16_t port = 45000; port < 45400; ++port)
        ++fresh[sent_to(run(fx.b, syn("198.51.100.7", port, kVip4).build()))];
    CHECK(fresh["b4"] > 60);

    // b2 drained: no new connection goes there, its connections go on.
    auto drained = four;
    drained[1].backend.draining = true;
    fx.b.set_backends(drained);
    for (uint16_t port = 46000; port < 46200; ++port)
        CHECK(sent_to(run(fx.b, syn("198.51.100.7", port, kVip4).build())) != "b2");
    for (auto& [p, was] : before) {
        if (was != "b2") continue;
        Packet data = p;
        data.tcp.options.clear();
        data.flags(tcpf::ACK).payload(50);
        CHECK(sent_to(run(fx.b, data.build())) == "b2");
    }
    // b2 removed: its flows have nowhere to go.
    auto removed = four;
    removed.erase(removed.begin() + 1);
    fx.b.set_backends(removed);
    CHECK(fx.b.index_of("b2") == -1);
    CHECK(fx.b.index_of("b4") == 3);  // indices stay with their names
    for (auto& [p, was] : before) {
        if (was != "b2") continue;
        Packet data = p;
        data.tcp.options.clear();
        data.flags(tcpf::ACK).payload(50);
        CHECK(run(fx.b, data.build()).action == XDP_DROP);  // its connection is gone
        // A SYN of the same 4-tuple again (a new connection reusing the port) is hashed anew.
        CHECK(sent_to(run(fx.b, p.build())) == fx.hashed(p, removed));
    }
    CHECK(fx.b.counters()[MPS_LB_C_NO_BACKEND] > 0);
}

TEST_CASE("lb: malformed options on a SYN to a VIP are dropped, counted", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    Packet p = Packet::v4("198.51.100.5", 40000, kVip4, kPort);
    p.flags(tcpf::SYN).option(opt::raw(30, {0x10, 0, 0}, 40));  // length past the header
    CHECK(run(fx.b, p.build()).action == XDP_DROP);
    CHECK(fx.b.counters()[MPS_LB_C_MALFORMED] == 1);
}

TEST_CASE("lb: bad services and backends are refused with the reason", "[lb]") {
    datapath::init_libbpf_logging();
    Fixture fx;
    CHECK_THROWS_WITH(fx.b.set_services({service(kVip4), service(kVip4)}),
                      Catch::Contains("given twice"));
    CHECK_THROWS_WITH(fx.b.set_backends({backend("b1", 1), backend("b1", 2)}),
                      Catch::Contains("b1"));
    // The running configuration is untouched.
    CHECK(sent_to(run(fx.b, syn("198.51.100.5", 40000, kVip4).build())) ==
          fx.hashed(syn("198.51.100.5", 40000, kVip4)));
}
