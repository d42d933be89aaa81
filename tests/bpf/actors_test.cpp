// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Actors: drop, pass, record, get_connect, get_subflow, rate_limit. Verdicts and output bytes
// as in the selector tests, plus the state they leave in the shared maps and the events they
// write. Each hook gets a fresh environment (flow state is per test and per hook).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "bpf_env.h"

using namespace mpsteer::test;

namespace {

constexpr const char* C4 = "10.1.0.1";
constexpr const char* S4 = "10.2.0.2";
constexpr const char* C6 = "2001:db8:1::1";
constexpr const char* S6 = "2001:db8:2::2";

Packet cli(bool v6, uint16_t sport = 40000) {
    return v6 ? Packet::v6(C6, sport, S6, 80) : Packet::v4(C4, sport, S4, 80);
}
Packet srv(bool v6, uint16_t dport = 40000) {
    return v6 ? Packet::v6(S6, 80, C6, dport) : Packet::v4(S4, 80, C4, dport);
}

void expect_untouched(const Run& r, const Bytes& in, Hook h) {
    CHECK(r.retval == retval_of(Verdict::pass, h));
    if (r.out != in) FAIL_CHECK("frame modified\n" << describe_frame(r.out, in));
}

}  // namespace

TEST_CASE("actor drop and pass", "[bpf][actor]") {
    for (bool v6 : {false, true}) {
        for (Hook h : mpsteer::kHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Bytes in = cli(v6).payload(5).build();
            {
                Env env(chain_of({step(MPS_ACT_DROP)}));
                Run r = env.run(h, in);
                CHECK(r.retval == retval_of(Verdict::drop, h));
                auto s = env.steps();
                CHECK(s[0].runs == 1);
                CHECK(s[0].matched == 1);
                CHECK(s[0].drops == 1);
            }
            {
                // pass ends the chain: the drop after it never runs
                Env env(chain_of({step(MPS_ACT_PASS, 1), step(MPS_ACT_DROP)}));
                Run r = env.run(h, in);
                expect_untouched(r, in, h);
                auto s = env.steps();
                CHECK(s[0].runs == 1);
                CHECK(s[0].matched == 1);
                CHECK(s[1].runs == 0);
                CHECK(env.gen().values[MPS_GC_PACKETS] == 1);
            }
            {
                // no chain on any hook: everything passes untouched
                dp::ChainSet empty;
                empty.policies = {"none"};
                Env env(empty);
                Run r = env.run(h, in);
                expect_untouched(r, in, h);
            }
        }
    }
}

TEST_CASE("actor record: packets and payload bytes per direction, mid-flow", "[bpf][actor]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(chain_of({step(MPS_ACT_RECORD)}));
            std::vector<std::pair<Packet, bool>> seq = {
                {cli(v6).payload(100), true},
                {srv(v6).payload(50), false},
                {cli(v6).payload(200), true},
                {srv(v6), false},
                {cli(v6), true},
            };
            for (auto& [p, from_client] : seq) {
                Bytes in = p.build();
                expect_untouched(env.run(h, in), in, h);
            }
            bool client_is_a = false;
            auto k = flow_key_of(cli(v6), &client_is_a);
            auto f = env.flow(k);
            REQUIRE(f);
            int c = client_is_a ? 0 : 1;
            CHECK(MPS_FLOW_DIR(f, c)->packets == 3);
            CHECK(MPS_FLOW_DIR(f, c)->bytes == 300);
            CHECK(MPS_FLOW_DIR(f, c ^ 1)->packets == 2);
            CHECK(MPS_FLOW_DIR(f, c ^ 1)->bytes == 50);
            CHECK(f->first_ns > 0);
            CHECK(f->last_ns >= f->first_ns);
            CHECK(f->srtt_us == 0);  // no timestamps: no RTT sample
            auto s = env.steps();
            CHECK(s[0].runs == 5);
            CHECK(s[0].matched == 5);
            // the reverse packet's key is the same entry
            auto rk = flow_key_of(srv(v6));
            CHECK(std::memcmp(&k, &rk, sizeof k) == 0);
        }
    }
}

TEST_CASE("actor record: RTT from TCP timestamps", "[bpf][actor]") {
    // A sample starts with a TSval this host sends (TC egress) and closes when its echo
    // comes in (XDP or TC ingress): that is the path's RTT, not the local stack's turnaround.
    // The option where Linux puts it (after two NOPs, read in place) and elsewhere (the walk).
    const std::vector<std::pair<const char*, std::vector<Bytes>>> layouts = {
        {"NOP NOP TS", {opt::nop(), opt::nop()}},
        {"TS first", {}},
        {"TS after SACK-permitted", {opt::sack_perm()}},
    };
    for (const auto& [layout, before] : layouts) {
        for (bool v6 : {false, true}) {
            for (Hook in : {Hook::xdp, Hook::tc_ingress}) {
                INFO(layout << (v6 ? " v6 " : " v4 ") << name_of(in));
                auto ts = [&](Packet p, uint32_t val, uint32_t ecr) {
                    for (const auto& o : before) p.option(o);
                    return p.option(opt::timestamps(val, ecr));
                };
                Env env(chain_of({step(MPS_ACT_RECORD)}));
                env.run(Hook::tc_egress, ts(cli(v6), 1000, 0).payload(10));
                usleep(20000);
                // an echo of an older value does not close the sample
                env.run(in, ts(srv(v6), 7000, 999));
                auto f0 = env.flow(cli(v6));
                REQUIRE(f0);
                CHECK(f0->srtt_us == 0);
                env.run(in, ts(srv(v6), 7001, 1000));
                auto f = env.flow(cli(v6));
                REQUIRE(f);
                CHECK(f->srtt_us >= 20000);
                CHECK(f->srtt_us < 2000000);
                CHECK(f->rttvar_us == f->srtt_us / 2);
                // a second, quicker sample moves the average by 1/8
                uint32_t first = f->srtt_us;
                env.run(Hook::tc_egress, ts(cli(v6), 1001, 7001));
                usleep(1000);
                env.run(in, ts(srv(v6), 7002, 1001));
                auto g = env.flow(cli(v6));
                REQUIRE(g);
                CHECK(g->srtt_us < first);
                CHECK(g->srtt_us >= first * 7 / 8);
            }
        }
    }
}

TEST_CASE("actor record: a TSval received and echoed by this host is no RTT sample",
          "[bpf][actor]") {
    for (Hook in : {Hook::xdp, Hook::tc_ingress}) {
        INFO(name_of(in));
        Env env(chain_of({step(MPS_ACT_RECORD)}));
        env.run(in, srv(false).option(opt::timestamps(7000, 0)).payload(10));
        usleep(5000);
        env.run(Hook::tc_egress, cli(false).option(opt::timestamps(1000, 7000)));
        auto f = env.flow(cli(false));
        REQUIRE(f);
        CHECK(f->srtt_us == 0);
    }
}

// Was B1 in NOTES-bpf-tests.md: the SYN/ACK used to reset the flow.
TEST_CASE("actor record: handshake packets count too, the SYN/ACK keeps the SYN's state",
          "[bpf][actor]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_RECORD)}));
        env.run(h, cli(false).flags(tcpf::SYN).seq(100));
        env.run(h, srv(false).flags(tcpf::SYN | tcpf::ACK).seq(900).ack(101));
        env.run(h, cli(false).seq(101).ack(901).payload(10));
        bool client_is_a = false;
        auto f = env.flow(flow_key_of(cli(false), &client_is_a));
        REQUIRE(f);
        int c = client_is_a ? 0 : 1;
        CHECK(MPS_FLOW_DIR(f, c)->packets == 2);
        CHECK(MPS_FLOW_DIR(f, c)->bytes == 10);
        CHECK(MPS_FLOW_DIR(f, c ^ 1)->packets == 1);
        CHECK(MPS_FLOW_DIR(f, c)->isn == 100);
        CHECK(MPS_FLOW_DIR(f, c ^ 1)->isn == 900);
    }
}

// ---- get_connect ----------------------------------------------------------------------------

TEST_CASE("actor get_connect: MP_CAPABLE keys into the flow and the ring buffer", "[bpf][actor]") {
    const uint64_t ka = 0x0123456789abcdef, kb = 0xfedcba9876543210;
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(chain_of({step(MPS_ACT_GET_CONNECT)}));
            bool client_is_a = false;
            auto key = flow_key_of(cli(v6), &client_is_a);
            const int c = client_is_a ? 0 : 1, s = c ^ 1;

            // SYN: MP_CAPABLE of length 4 has no key; nothing to report
            Bytes syn = cli(v6).flags(tcpf::SYN).seq(1).option(mptcp::capable_syn()).build();
            expect_untouched(env.run(h, syn), syn, h);
            CHECK(env.events().empty());
            CHECK(env.steps()[0].matched == 0);

            // SYN/ACK: the server's key
            Bytes sa = srv(v6)
                           .flags(tcpf::SYN | tcpf::ACK)
                           .option(mptcp::capable_synack(kb, 0x81))
                           .build();
            expect_untouched(env.run(h, sa), sa, h);
            auto ev = env.events();
            REQUIRE(ev.size() == 1);
            CHECK(ev[0].raw.type == MPS_EV_MP_CAPABLE);
            CHECK(ev[0].raw.key[0] == wire64(kb));
            CHECK(ev[0].raw.key[1] == 0);
            CHECK(ev[0].raw.version == 1);
            CHECK(ev[0].raw.flags == 0x81);
            CHECK(ev[0].raw.from_a == (client_is_a ? 0 : 1));
            CHECK(ev[0].raw.hook == uint8_t(h));
            CHECK(std::memcmp(&ev[0].raw.flow, &key, sizeof key) == 0);
            auto f = env.flow(key);
            REQUIRE(f);
            CHECK(f->key[s] == wire64(kb));

            // third ACK: both keys, sender's first
            Bytes ack = cli(v6).option(mptcp::capable_ack(ka, kb)).build();
            expect_untouched(env.run(h, ack), ack, h);
            ev = env.events();
            REQUIRE(ev.size() == 1);
            CHECK(ev[0].raw.key[0] == wire64(ka));
            CHECK(ev[0].raw.key[1] == wire64(kb));
            CHECK(ev[0].raw.from_a == (client_is_a ? 1 : 0));
            // the reader derived the tokens and wrote them back (flow and connection)
            CHECK(ev[0].token_a == token_of(client_is_a ? ka : kb));
            CHECK(ev[0].token_b == token_of(client_is_a ? kb : ka));
            f = env.flow(key);
            REQUIRE(f);
            CHECK(f->key[c] == wire64(ka));
            CHECK(f->key[s] == wire64(kb));
            CHECK(f->role == MPS_ROLE_INITIAL);
            CHECK(f->token[c] == token_of(ka));
            CHECK(f->token[s] == token_of(kb));
            CHECK(f->idsn[c] == idsn_of(ka));
            CHECK(f->idsn[s] == idsn_of(kb));
            uint32_t lo = std::min(token_of(ka), token_of(kb)),
                     hi = std::max(token_of(ka), token_of(kb));
            CHECK(f->conn_token == lo);
            auto conn = env.conn(lo);
            REQUIRE(conn);
            CHECK(conn->token[0] == lo);
            CHECK(conn->token[1] == hi);

            // MP_CAPABLE with data (length 24) repeats known keys: nothing new to report
            Bytes data =
                cli(v6).option(mptcp::capable({1, 0x81, ka, kb, 10, 0xbeef})).payload(10).build();
            expect_untouched(env.run(h, data), data, h);
            CHECK(env.events().empty());
            // other keys on the same 4-tuple (spoofed): the connection keeps its keys
            Bytes forged = cli(v6).option(mptcp::capable_ack(0x77, 0x88)).build();
            expect_untouched(env.run(h, forged), forged, h);
            CHECK(env.events().empty());
            f = env.flow(key);
            REQUIRE(f);
            CHECK(f->key[c] == wire64(ka));
            CHECK(f->key[s] == wire64(kb));
            CHECK(f->token[c] == token_of(ka));
            Bytes plain = cli(v6).payload(10).build();
            expect_untouched(env.run(h, plain), plain, h);
            CHECK(env.events().empty());
            auto st = env.steps();
            CHECK(st[0].runs == 6);
            CHECK(st[0].matched == 4);
            CHECK(env.gen().values[MPS_GC_EVENTS_LOST] == 0);
        }
    }
}

TEST_CASE("actor get_connect: MPTCP v0 SYN carries the key", "[bpf][actor]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_GET_CONNECT)}));
        Bytes syn =
            cli(false).flags(tcpf::SYN).option(mptcp::capable({0, 0x81, 0x42, {}, {}, {}})).build();
        expect_untouched(env.run(h, syn), syn, h);
        auto ev = env.events();
        REQUIRE(ev.size() == 1);
        CHECK(ev[0].raw.version == 0);
        CHECK(ev[0].raw.key[0] == wire64(0x42));
        auto f = env.flow(cli(false));
        REQUIRE(f);
        bool client_is_a = false;
        flow_key_of(cli(false), &client_is_a);
        CHECK(f->key[client_is_a ? 0 : 1] == wire64(0x42));
    }
}

TEST_CASE("actor get_connect: a full ring buffer loses the event, not the keys", "[bpf][actor]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_GET_CONNECT)}));
        // 256 KiB of ring buffer holds fewer than 3000 events of this size: 3000 connections,
        // each reported once.
        const uint16_t first = 20000, count = 3000;
        for (uint16_t i = 0; i < count; i++) {
            env.run(h,
                    cli(false, uint16_t(first + i)).flags(tcpf::SYN).option(mptcp::capable_syn()));
            env.run(h, cli(false, uint16_t(first + i)).option(mptcp::capable_ack(0x77 + i, 0x88)));
        }
        CHECK(env.gen().values[MPS_GC_EVENTS_LOST] > 0);
        bool client_is_a = false;
        auto f = env.flow(flow_key_of(cli(false, uint16_t(first + count - 1)), &client_is_a));
        REQUIRE(f);
        CHECK(f->key[client_is_a ? 0 : 1] == wire64(0x77 + count - 1));
        CHECK(f->key[client_is_a ? 1 : 0] == wire64(0x88));
    }
}

// ---- get_subflow / MP_JOIN ------------------------------------------------------------------

TEST_CASE("entry program: an MP_JOIN SYN stores the receiver's token in the flow", "[bpf][actor]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(chain_of({step(MPS_ACT_PASS)}));
            Bytes syn = cli(v6, 41000)
                            .flags(tcpf::SYN)
                            .seq(77)
                            .option(mptcp::join_syn(0xa1b2c3d4, 0x01020304, 5, true))
                            .build();
            expect_untouched(env.run(h, syn), syn, h);
            bool client_is_a = false;
            auto f = env.flow(flow_key_of(cli(v6, 41000), &client_is_a));
            REQUIRE(f);
            int c = client_is_a ? 0 : 1;
            CHECK(f->role == MPS_ROLE_JOIN);
            CHECK(f->token[c ^ 1] == 0xa1b2c3d4);
            CHECK(f->token[c] == 0);
            CHECK(f->backup == 1);
            CHECK(f->conn_token == 0);  // no connection entry yet: the agent links it later
            CHECK(MPS_FLOW_DIR(f, c)->isn == 77);
            CHECK(MPS_FLOW_DIR(f, c)->wscale_known == 1);
        }
    }
}

TEST_CASE("entry program: MP_JOIN token of a known connection maps to its entry", "[bpf][actor]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_GET_CONNECT)}));
        const uint64_t ka = 0x1111, kb = 0x2222;
        env.run(h, cli(false).flags(tcpf::SYN).option(mptcp::capable_syn()));
        env.run(h, cli(false).option(mptcp::capable_ack(ka, kb)));
        env.events();  // the reader creates the connection entry
        uint32_t lo = std::min(token_of(ka), token_of(kb));
        REQUIRE(env.conn(lo));
        env.run(h, cli(false, 41000).flags(tcpf::SYN).option(mptcp::join_syn(lo, 9)));
        auto f = env.flow(cli(false, 41000));
        REQUIRE(f);
        CHECK(f->conn_token == lo);
    }
}

TEST_CASE("actor get_subflow: MP_JOIN SYN reported", "[bpf][actor]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(chain_of({step(MPS_ACT_GET_SUBFLOW)}));
            Bytes syn = cli(v6, 41000)
                            .flags(tcpf::SYN)
                            .option(mptcp::join_syn(0xa1b2c3d4, 0x01020304, 5, true))
                            .build();
            expect_untouched(env.run(h, syn), syn, h);
            auto ev = env.events();
            REQUIRE(ev.size() == 1);
            bool client_is_a = false;
            auto key = flow_key_of(cli(v6, 41000), &client_is_a);
            CHECK(ev[0].raw.type == MPS_EV_MP_JOIN);
            CHECK(ev[0].raw.token == 0xa1b2c3d4);
            CHECK(ev[0].raw.nonce == 0x01020304);
            CHECK(ev[0].raw.addr_id == 5);
            CHECK(ev[0].raw.flags == 1);
            CHECK(ev[0].raw.from_a == (client_is_a ? 1 : 0));
            CHECK(std::memcmp(&ev[0].raw.flow, &key, sizeof key) == 0);
            CHECK(env.steps()[0].matched == 1);
        }
    }
}

TEST_CASE("actor get_subflow: nothing to report outside an MP_JOIN SYN", "[bpf][actor]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_GET_SUBFLOW)}));
        std::vector<Packet> ps = {
            srv(false, 41000).flags(tcpf::SYN | tcpf::ACK).option(mptcp::join_synack(1, 2)),
            cli(false, 41000).option(mptcp::join_ack({})),
            cli(false, 41000).flags(tcpf::SYN).option(mptcp::capable_syn()),
            cli(false, 41000).payload(3),
        };
        for (auto& p : ps) {
            Bytes in = p.build();
            expect_untouched(env.run(h, in), in, h);
        }
        CHECK(env.events().empty());
        CHECK(env.steps()[0].runs == 4);
        CHECK(env.steps()[0].matched == 0);
    }
}

// ---- rate_limit -------------------------------------------------------------------------------

namespace {

struct RateCase {
    std::string name;
    uint64_t rate;
    uint32_t rtt_us;
    uint32_t min_window;
    std::optional<uint8_t> client_ws;  // window scale in the client's SYN (absent: no option)
    std::optional<uint8_t> server_ws;
    bool from_client;
    uint16_t window;  // the packet's window field
    bool v6;
    uint64_t flow_rate = 0;  // per-subflow override written into the flow
    uint32_t flow_srtt = 0;  // RTT sample in the flow
    uint16_t port = 40000;   // client port: one flow per case
};

// The window the actor should advertise, or nullopt to leave the packet alone (computed from
// the actor's documented rule, not from its output).
std::optional<uint16_t> expected_window(const RateCase& c) {
    uint64_t rate = c.flow_rate ? c.flow_rate : c.rate;
    uint64_t rtt = c.flow_srtt ? c.flow_srtt : c.rtt_us;
    if (!rate || !rtt) return std::nullopt;
    rate = std::clamp<uint64_t>(rate, MPS_RATE_MIN, MPS_RATE_MAX);
    rtt = std::min<uint64_t>(rtt, 60000000);
    // A flow's first ACK: all the credit, the bucket's depth (abi.h, MPS_RATE_BURST_MS).
    uint64_t bytes = 2 * rate * rtt / 1000000;
    bytes = std::max<uint64_t>({bytes, c.min_window, rate * MPS_RATE_BURST_MS / 1000});
    bytes = std::min<uint64_t>(bytes, MPS_RATE_WINDOW_MAX);
    // Scaling is in effect only when both SYNs carried the option (RFC 7323); rounded down.
    auto ws = c.from_client ? c.client_ws : c.server_ws;
    uint8_t shift = c.client_ws && c.server_ws ? std::min<uint8_t>(*ws, 14) : 0;
    uint64_t field = bytes >> shift;
    if (field >= c.window) return std::nullopt;
    return uint16_t(field);
}

std::vector<RateCase> rate_cases() {
    std::vector<RateCase> t;
    for (bool v6 : {false, true}) {
        std::string f = v6 ? "v6 " : "v4 ";
        t.push_back({f + "client ACK, scale 7", 100000, 10000, 0, 7, 2, true, 1000, v6});
        t.push_back({f + "server ACK, scale 2", 100000, 10000, 0, 7, 2, false, 60000, v6});
        t.push_back(
            {f + "no window scale option: shift 0", 100000, 10000, 0, {}, {}, true, 60000, v6});
        t.push_back({f + "SYN/ACK without window scale: shift 0",
                     100000,
                     10000,
                     0,
                     7,
                     {},
                     true,
                     60000,
                     v6});
        t.push_back(
            {f + "SYN without window scale: shift 0", 100000, 10000, 0, {}, 7, false, 60000, v6});
        t.push_back({f + "per-subflow rate beyond the range: clamped, no overflow", 100000, 10000,
                     0, 0, 0, true, 60000, v6, 10000000000000000000ull});
        t.push_back({f + "flow RTT of an hour: clamped to a minute", 100000, 10000, 0, 14, 14, true,
                     60000, v6, 2000, 3600000000u});
        t.push_back({f + "scale 14", 100000000, 100000, 0, 14, 0, true, 60000, v6});
        t.push_back(
            {f + "scale 15 is clamped to 14", 100000000, 100000, 0, 15, 0, true, 60000, v6});
        t.push_back(
            {f + "tiny rate: the bucket rounds down to 0", 1, 1000, 0, 7, 7, true, 500, v6});
        t.push_back({f + "min_window floor", 1000, 1000, 20000, 0, 0, true, 60000, v6});
        t.push_back({f + "per-subflow rate wins", 100000, 10000, 0, 0, 0, true, 60000, v6, 5000});
        t.push_back({f + "flow RTT wins", 1000, 2000000, 0, 0, 0, true, 60000, v6, 0, 4000000});
        // left alone
        t.push_back({f + "never raises a window", 100000, 10000, 0, 0, 0, true, 500, v6});
        t.push_back({f + "equal window untouched", 100000, 10000, 0, 0, 0, true, 1000, v6});
        t.push_back({f + "rate 0: no cap", 0, 10000, 0, 0, 0, true, 60000, v6});
        t.push_back({f + "rtt 0 and no sample: no cap", 100000, 0, 0, 0, 0, true, 60000, v6});
    }
    return t;
}

Packet rate_packet(const RateCase& c, uint16_t window) {
    Packet p = c.from_client ? cli(c.v6, c.port).seq(5001).ack(9001)
                             : srv(c.v6, c.port).seq(9001).ack(5001);
    return p.window(window)
        .option(opt::nop())
        .option(opt::nop())
        .option(opt::timestamps(111, 222))
        .payload(33, 0x5c);
}

void handshake(Env& env, Hook h, const RateCase& c) {
    Packet syn = cli(c.v6, c.port).flags(tcpf::SYN).seq(5000).window(65535).option(opt::mss(1460));
    if (c.client_ws) syn.option(opt::wscale(*c.client_ws));
    Packet sa = srv(c.v6, c.port)
                    .flags(tcpf::SYN | tcpf::ACK)
                    .seq(9000)
                    .ack(5001)
                    .window(65535)
                    .option(opt::mss(1460));
    if (c.server_ws) sa.option(opt::wscale(*c.server_ws));
    for (auto* p : {&syn, &sa}) {
        Bytes in = p->build();
        // never touches a SYN, however large its window
        expect_untouched(env.run(h, in), in, h);
    }
}

// The chains rate_limit runs in: alone, and right after record, whose program then does both
// on the flow it looked up (datapath.bpf.c, act_record_body). Its step index in each.
struct RateChain {
    const char* name;
    std::vector<mps_step> steps;
    uint16_t at;
};
std::vector<RateChain> rate_chains() {
    return {{"alone", {act_rate(0, 0, 0)}, 0},
            {"after record", {step(MPS_ACT_RECORD, 1), act_rate(0, 0, 0)}, 1}};
}

void run_rate_cases(bool modifying, const RateChain& chain) {
    // One generation per hook; each case rewrites the actor's parameters and uses its own flow.
    for (Hook h : kCaseHooks) {
        Env env(chain_of(chain.steps));
        uint16_t port = 30000;
        for (RateCase c : rate_cases()) {
            c.port = port++;
            bool mod = expected_window(c).has_value();
            if (mod != modifying) continue;
            INFO(c.name << " via " << name_of(h) << ", " << chain.name);
            env.set_step(chain.at, act_rate(c.rate, c.rtt_us, c.min_window));
            handshake(env, h, c);
            if (c.flow_rate || c.flow_srtt) {
                auto k = flow_key_of(cli(c.v6, c.port));
                auto f = env.flow(k);
                REQUIRE(f);
                f->rate_bps = c.flow_rate;
                f->srtt_us = c.flow_srtt;
                env.put_flow(k, *f);
            }
            Bytes in = rate_packet(c, c.window).build();
            Snap before = Snap::of(env);
            Run r = env.run(h, in);
            Snap after = Snap::of(env);
            CHECK(r.retval == retval_of(Verdict::pass, h));
            auto win = expected_window(c);
            Bytes want = win ? rate_packet(c, *win).build() : in;
            if (r.out != want) FAIL_CHECK("unexpected output\n" << describe_frame(r.out, want));
            CHECK(checksum_errors(r.out) == "");
            CHECK(step_delta(before, after, chain.at).runs == 1);
            CHECK(step_delta(before, after, chain.at).matched == (win ? 1u : 0u));
            if (chain.at) {  // record counted the packet, and the packet into its flow
                CHECK(step_delta(before, after, 0).runs == 1);
                CHECK(step_delta(before, after, 0).matched == 1);
                auto f = env.flow(flow_key_of(cli(c.v6, c.port)));
                REQUIRE(f);
                CHECK(f->dir_ab.bytes + f->dir_ba.bytes == 33);
            }
        }
    }
}

}  // namespace

TEST_CASE("actor rate_limit: lowers the window, honours the scale, fixes the checksum",
          "[bpf][actor]") {
    for (const auto& chain : rate_chains()) run_rate_cases(true, chain);
}

TEST_CASE("actor rate_limit: leaves the window alone when it should", "[bpf][actor]") {
    for (const auto& chain : rate_chains()) run_rate_cases(false, chain);
}

TEST_CASE(
    "actor rate_limit: only time moves the edge, a lower rate cuts the credit, a subflow at the edge gets a zero window",
    "[bpf][actor]") {
    // 1000 bytes/s with scale 7 (128-byte units): a unit of window is 128 ms of time, far more
    // than passes between two runs, so the windows before the sleep are exact.
    RateCase c{"", 1000, 1000, 0, 7, 7, true, 60000, false};
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({act_rate(c.rate, c.rtt_us, c.min_window)}));
        c.port = 31000 + static_cast<uint16_t>(h);
        handshake(env, h, c);
        auto window_after = [&](uint32_t acked) {
            Bytes in = cli(false, c.port).seq(5001).ack(9001 + acked).window(60000).build();
            Run r = env.run(h, in);
            CHECK(checksum_errors(r.out) == "");
            REQUIRE(r.out.size() == in.size());
            return uint16_t(r.out[48] << 8 | r.out[49]);  // after 14 + 20 bytes of headers
        };
        // The first ACK: the bucket (1 s at the rate: 1000 bytes, 7 units rounded down).
        CHECK(window_after(0) == 1000 / 128);
        // 744 bytes acknowledged: 256 left to the edge.
        CHECK(window_after(744) == 2);
        // Forged (or stale) acks move nothing: one past the edge gets a zero window, one far
        // behind it the window of an idle subflow, and the subflow's next ACK the same as
        // before them.
        CHECK(window_after(1000000) == 0);
        CHECK(window_after(uint32_t(-100000)) == 1000 / 128);
        CHECK(window_after(744) == 2);
        // Everything up to the edge acknowledged: nothing left, a zero window.
        CHECK(window_after(1000) == 0);
        // Time moves the edge: 300 ms later, 300 bytes more (2 units; more if the sleep ran
        // long, never more than the bucket).
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        uint16_t later = window_after(1000);
        CHECK(later >= 2);
        CHECK(later <= 1000 / 128);
        // A lower rate caps the credit at once: 200 bytes/s keeps 200 bytes (one unit), and
        // 150 more bytes acknowledged leave 50 (none).
        env.set_step(0, act_rate(200, c.rtt_us, c.min_window));
        CHECK(window_after(1000) == 1);
        CHECK(window_after(1150) == 0);
    }
}

TEST_CASE("actor rate_limit: a fast subflow back from a pause keeps its whole credit",
          "[bpf][actor]") {
    // Above 2^30 bytes a second the credit (at most 2^30 bytes, 65536 units at scale 14)
    // grows past 2^31 bytes within a second: the edge must not wrap around the ack and close
    // the window. The pause is made by moving the edge's clock back.
    for (uint64_t rate : {uint64_t{1250000000} /* 10 Gbit/s */, uint64_t{MPS_RATE_MAX}}) {
        for (Hook h : kCaseHooks) {
            INFO(name_of(h) << ", " << rate << " bytes/s");
            RateCase c{"", rate, 1000, 0, 14, 14, true, 65535, false};
            c.port = static_cast<uint16_t>(32000 + static_cast<int>(h));
            Env env(chain_of({act_rate(c.rate, c.rtt_us, c.min_window)}));
            handshake(env, h, c);
            auto ack_of = [&](uint32_t acked) {
                return cli(false, c.port).seq(5001).ack(9001 + acked).window(65535).build();
            };
            const Bytes first = ack_of(0);
            expect_untouched(env.run(h, first), first, h);  // the bucket: 65536 units
            // Below its rate (what is left covers the window asked for) a segment leaves the
            // edge as it was: no clock read, no write.
            const auto before = env.flow(cli(false, c.port));
            REQUIRE(before);
            const Bytes below = ack_of(1000);
            expect_untouched(env.run(h, below), below, h);
            const auto after = env.flow(cli(false, c.port));
            REQUIRE(after);
            CHECK(std::memcmp(after->rate_edge_ns, before->rate_edge_ns,
                              sizeof before->rate_edge_ns) == 0);
            CHECK(std::memcmp(after->rate_edge, before->rate_edge, sizeof before->rate_edge) == 0);
            uint32_t acked = 1000;
            for (int pause_ms : {30, 100, 500, 1500}) {
                INFO("a pause of " << pause_ms << " ms");
                auto f = env.flow(cli(false, c.port));
                REQUIRE(f);
                for (auto& at : f->rate_edge_ns)
                    if (at) at -= uint64_t(pause_ms) * 1000000;
                env.put_flow(flow_key_of(cli(false, c.port)), *f);
                // 20 KB more acknowledged: less left than the window asks for, so the edge
                // grows by the pause, up to the whole bucket again.
                acked += 20000;
                const Bytes ack = ack_of(acked);
                expect_untouched(env.run(h, ack), ack, h);
            }
        }
    }
}

TEST_CASE("actor rate_limit: never touches SYN, RST, non-ACK or unknown flows", "[bpf][actor]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            for (const auto& chain : rate_chains()) {
                INFO((v6 ? "v6 " : "v4 ") << name_of(h) << ", " << chain.name);
                Env env(chain_of(chain.steps));
                env.set_step(chain.at, act_rate(1000, 1000, 0));
                // a flow never seen: no scale known
                Bytes unknown = cli(v6, 45000).window(60000).payload(4).build();
                expect_untouched(env.run(h, unknown), unknown, h);
                RateCase c{"", 1000, 1000, 0, 0, 0, true, 60000, v6};
                handshake(env, h, c);
                std::vector<Packet> ps = {
                    cli(v6).flags(tcpf::SYN).window(60000),
                    cli(v6).flags(tcpf::SYN | tcpf::ACK).window(60000),
                    cli(v6).flags(tcpf::RST | tcpf::ACK).window(60000),
                    cli(v6).flags(tcpf::RST).window(60000),
                    cli(v6).flags(tcpf::PSH).window(60000).payload(3),
                };
                for (auto& p : ps) {
                    Bytes in = p.build();
                    expect_untouched(env.run(h, in), in, h);
                }
            }
        }
    }
}

TEST_CASE("actor rate_limit: the other direction's SYN comes from an entry that only learns",
          "[bpf][actor]") {
    // rate_limit at TC egress alone (the receiver lowers its own ACKs' windows): the client's
    // SYN arrives where no chain runs. The compiler attaches the entry at TC ingress with the
    // learn flag; without it the window scale stays unknown and nothing is lowered.
    for (bool learn : {true, false}) {
        for (bool v6 : {false, true}) {
            INFO((v6 ? "v6" : "v4") << (learn ? ", learning at tc_ingress" : ", no learning"));
            dp::ChainSet chains;
            chains.policies = {"limit"};
            chains.steps = {act_rate(100000, 10000, 0)};
            chains.entries = {{Hook::tc_egress, "", 0}};
            if (learn) chains.learning_hooks = {Hook::tc_ingress};
            Env env(chains);
            RateCase c{"", 100000, 10000, 0, 7, 2, false, 60000, v6};
            Packet syn = cli(v6).flags(tcpf::SYN).seq(5000).window(65535).option(opt::wscale(7));
            Packet sa = srv(v6)
                            .flags(tcpf::SYN | tcpf::ACK)
                            .seq(9000)
                            .ack(5001)
                            .window(65535)
                            .option(opt::wscale(2));
            Bytes in = syn.build();
            expect_untouched(env.run(Hook::tc_ingress, in), in, Hook::tc_ingress);
            in = sa.build();
            expect_untouched(env.run(Hook::tc_egress, in), in, Hook::tc_egress);
            auto f = env.flow(flow_key_of(cli(v6)));
            REQUIRE(f);
            CHECK(f->dir_ab.wscale_known + f->dir_ba.wscale_known == (learn ? 2 : 1));

            // Nothing but learning at TC ingress: data, and a SYN with malformed options
            // (dropped under a guarded chain, passed here), go through untouched.
            for (Bytes b :
                 {cli(v6).seq(5001).ack(9001).window(60000).payload(20, 1).build(),
                  cli(v6, 41000).flags(tcpf::SYN).option(opt::raw(30, {0x00}, 1)).build()})
                expect_untouched(env.run(Hook::tc_ingress, b), b, Hook::tc_ingress);

            Bytes ack = rate_packet(c, 60000).build();
            Run r = env.run(Hook::tc_egress, ack);
            auto win = expected_window(c);
            REQUIRE(win);
            Bytes want = learn ? rate_packet(c, *win).build() : ack;
            if (r.out != want) FAIL_CHECK("unexpected output\n" << describe_frame(r.out, want));
            CHECK(checksum_errors(r.out) == "");
        }
    }
}

// ---- flow learning under spoofing and at the end of a flow -----------------------------------

namespace {

// A completed MPTCP handshake on cli(v6) / srv(v6): ISNs 100 / 900, window shifts 7 / 9, keys.
void handshake(Env& env, Hook h, bool v6, uint64_t ka = 0x1111, uint64_t kb = 0x2222) {
    env.run(h,
            cli(v6).flags(tcpf::SYN).seq(100).option(opt::wscale(7)).option(mptcp::capable_syn()));
    env.run(h, srv(v6)
                   .flags(tcpf::SYN | tcpf::ACK)
                   .seq(900)
                   .ack(101)
                   .option(opt::wscale(9))
                   .option(mptcp::capable_synack(kb, 0x81)));
    env.run(h, cli(v6).seq(101).ack(901).option(mptcp::capable_ack(ka, kb)));
}

// What a spoofed packet must not change in a flow entry (counters and clocks may move).
void check_same_state(const mps_flow& was, const mps_flow& is) {
    for (int d = 0; d < 2; d++) {
        INFO("side " << d);
        CHECK(MPS_FLOW_DIR(&is, d)->isn == MPS_FLOW_DIR(&was, d)->isn);
        CHECK(MPS_FLOW_DIR(&is, d)->wscale == MPS_FLOW_DIR(&was, d)->wscale);
        CHECK(MPS_FLOW_DIR(&is, d)->wscale_known == MPS_FLOW_DIR(&was, d)->wscale_known);
        CHECK(is.key[d] == was.key[d]);
        CHECK(is.token[d] == was.token[d]);
        CHECK(is.idsn[d] == was.idsn[d]);
    }
    CHECK(is.conn_token == was.conn_token);
    CHECK(is.rate_bps == was.rate_bps);
    CHECK(is.role == was.role);
    CHECK(is.backup == was.backup);
    CHECK(is.ended == was.ended);
}

std::vector<dp::Event> of_type(const std::vector<dp::Event>& evs, uint8_t type) {
    std::vector<dp::Event> out;
    for (const auto& e : evs)
        if (e.raw.type == type) out.push_back(e);
    return out;
}

}  // namespace

TEST_CASE("flow learning: a spoofed SYN, SYN/ACK or MP_CAPABLE cannot rewrite a live flow",
          "[bpf][actor][state]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(chain_of({step(MPS_ACT_GET_CONNECT)}));
            handshake(env, h, v6);
            CHECK(of_type(env.events(), MPS_EV_MP_CAPABLE).size() == 2);
            auto key = flow_key_of(cli(v6));
            auto was = env.flow(key);
            REQUIRE(was);
            REQUIRE(was->key[0] != 0);
            REQUIRE(was->key[1] != 0);
            was->rate_bps = 12345;  // as a hook's set_subflow would
            env.put_flow(key, *was);

            const Packet forged[] = {
                cli(v6)
                    .flags(tcpf::SYN)
                    .seq(5555)
                    .option(opt::wscale(1))
                    .option(mptcp::capable_syn()),
                cli(v6).flags(tcpf::SYN).seq(5555).option(
                    mptcp::capable({0, 0x81, 0x99, {}, {}, {}})),
                srv(v6)
                    .flags(tcpf::SYN | tcpf::ACK)
                    .seq(7777)
                    .option(opt::wscale(0))
                    .option(mptcp::capable_synack(0x99, 0x81)),
                srv(v6).flags(tcpf::SYN | tcpf::ACK).seq(7777).option(mptcp::join_synack(9, 9, 1)),
                cli(v6).option(mptcp::capable_ack(0x99, 0x98)),
                srv(v6).option(mptcp::capable_ack(0x99, 0x98)),
            };
            for (const auto& p : forged) {
                Bytes b = p.build();
                expect_untouched(env.run(h, b), b, h);
                auto is = env.flow(key);
                REQUIRE(is);
                check_same_state(*was, *is);
                CHECK(env.events().empty());
            }
        }
    }
}

TEST_CASE("flow learning: MP_CAPABLE keys without a handshake the datapath saw create nothing",
          "[bpf][actor][state]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_RECORD, 1, 1), step(MPS_ACT_GET_CONNECT)}));
        // mid-stream: the flow entry exists (record made it) but no SYN was seen
        env.run(h, cli(false).payload(10));
        REQUIRE(env.flow(cli(false)));
        Bytes ack = cli(false).option(mptcp::capable_ack(0x1111, 0x2222)).build();
        expect_untouched(env.run(h, ack), ack, h);
        CHECK(env.events().empty());
        auto f = env.flow(cli(false));
        REQUIRE(f);
        CHECK(f->key[0] == 0);
        CHECK(f->key[1] == 0);
        CHECK(f->conn_token == 0);
        CHECK_FALSE(env.conn(std::min(token_of(0x1111), token_of(0x2222))));
        // and on a 4-tuple the datapath has never seen
        Bytes other = cli(false, 41234).option(mptcp::capable_ack(0x3333, 0x4444)).build();
        expect_untouched(env.run(h, other), other, h);
        CHECK(env.events().empty());
        CHECK_FALSE(env.conn(std::min(token_of(0x3333), token_of(0x4444))));
        CHECK(env.steps()[1].runs == 3);
        CHECK(env.steps()[1].matched == 0);
    }
}

TEST_CASE("flow learning: a FIN from each side or a RST closes the flow, reported once",
          "[bpf][actor][state]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            for (bool by_rst : {false, true}) {
                INFO((v6 ? "v6 " : "v4 ") << name_of(h) << (by_rst ? " RST" : " FIN"));
                Env env(chain_of({step(MPS_ACT_GET_CONNECT)}));
                handshake(env, h, v6);
                env.events();
                auto key = flow_key_of(cli(v6));

                if (!by_rst) {
                    Bytes fin_c = cli(v6).flags(tcpf::FIN | tcpf::ACK).seq(200).build();
                    expect_untouched(env.run(h, fin_c), fin_c, h);
                    expect_untouched(env.run(h, fin_c), fin_c, h);  // retransmitted
                    CHECK(env.events().empty());
                    CHECK_FALSE(env.flow(key)->ended & MPS_FLOW_CLOSED);
                    Bytes fin_s = srv(v6).flags(tcpf::FIN | tcpf::ACK).seq(950).build();
                    expect_untouched(env.run(h, fin_s), fin_s, h);
                    auto ev = env.events();
                    REQUIRE(ev.size() == 1);
                    CHECK(ev[0].raw.type == MPS_EV_FLOW_CLOSED);
                    CHECK(ev[0].raw.flags == 0);
                    CHECK(std::memcmp(&ev[0].raw.flow, &key, sizeof key) == 0);
                    expect_untouched(env.run(h, fin_s), fin_s, h);
                    env.run(h, cli(v6).flags(tcpf::RST).seq(201));
                    CHECK(env.events().empty());
                } else {
                    Bytes rst = srv(v6).flags(tcpf::RST).seq(950).build();
                    expect_untouched(env.run(h, rst), rst, h);
                    auto ev = env.events();
                    REQUIRE(ev.size() == 1);
                    CHECK(ev[0].raw.type == MPS_EV_FLOW_CLOSED);
                    CHECK(ev[0].raw.flags == 1);
                    env.run(h, rst);
                    env.run(h, cli(v6).flags(tcpf::FIN | tcpf::ACK).seq(200));
                    CHECK(env.events().empty());
                    // a SYN/ACK alone does not revive a closed flow
                    env.run(h,
                            srv(v6).flags(tcpf::SYN | tcpf::ACK).seq(7777).option(opt::wscale(0)));
                    auto f = env.flow(key);
                    REQUIRE(f);
                    CHECK(MPS_FLOW_DIR(f, f->dir_ab.isn == 900 ? 0 : 1)->isn == 900);
                    CHECK(f->ended & MPS_FLOW_CLOSED);
                }
                // a new connection on the same 4-tuple starts afresh and can be closed again
                handshake(env, h, v6, 0x5555, 0x6666);
                auto f = env.flow(key);
                REQUIRE(f);
                CHECK(f->ended == 0);
                bool client_is_a = false;
                flow_key_of(cli(v6), &client_is_a);
                CHECK(f->key[client_is_a ? 0 : 1] == wire64(0x5555));
                CHECK(of_type(env.events(), MPS_EV_MP_CAPABLE).size() == 2);
                env.run(h, cli(v6).flags(tcpf::RST).seq(300));
                CHECK(of_type(env.events(), MPS_EV_FLOW_CLOSED).size() == 1);
            }
        }
    }
}

TEST_CASE("flow learning: FIN and RST of flows the datapath never saw are not reported",
          "[bpf][actor][state]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_PASS)}));
        for (uint16_t port = 30000; port < 30100; port++) {
            env.run(h, cli(false, port).flags(tcpf::RST).seq(port));
            env.run(h, cli(false, port).flags(tcpf::FIN | tcpf::ACK));
            env.run(h, srv(false, port).flags(tcpf::FIN | tcpf::ACK));
        }
        CHECK(env.events().empty());
        CHECK_FALSE(env.flow(cli(false, 30000)));
    }
}

TEST_CASE("state tables: a SYN flood's evictions are counted, established flows among them",
          "[bpf][actor][state]") {
    dp::TableSizes sizes;
    sizes.flows = dp::TableSizes::kMinFlows;
    const Hook h = Hook::xdp;
    Env env(chain_of({step(MPS_ACT_PASS)}), sizes);
    auto table = [&](const std::string& name) {
        for (auto& t : env.state().tables(true))
            if (t.name == name) return t;
        FAIL("no table " << name);
        return dp::TableInfo{};
    };
    handshake(env, h, false);
    for (uint16_t port = 20000; port < 20100; port++)
        env.run(h, cli(false, port).flags(tcpf::SYN).seq(port));
    auto flows = table("flows");
    REQUIRE(flows.entries);
    REQUIRE(flows.evictions);
    CHECK(*flows.entries == 101);
    CHECK(*flows.evictions == 0);
    // Every count is of flows: a second walk finds the same, and SYNs of known flows add none.
    env.run(h, cli(false, 20000).flags(tcpf::SYN).seq(1));
    CHECK(*table("flows").entries == 101);
    CHECK(*table("flows").evictions == 0);

    // Four times the table in new SYNs (spoofed sources cost an attacker nothing).
    const uint32_t flood = 4 * sizes.flows;
    for (uint32_t i = 0; i < flood; i++)
        env.run(h, cli(false, uint16_t(30000 + i)).flags(tcpf::SYN).seq(i));
    flows = table("flows");
    INFO("entries " << *flows.entries << ", evictions " << *flows.evictions);
    CHECK(*flows.entries <= sizes.flows);
    CHECK(*flows.entries > sizes.flows / 2);
    CHECK(*flows.evictions == 101 + flood - *flows.entries);
    CHECK_FALSE(env.flow(cli(false)));  // the established flow was pushed out, and counted

    auto announces = table("announces");
    CHECK(announces.entries == 0u);
    CHECK(announces.evictions == 0u);
    CHECK_FALSE(table("conns").evictions);  // filled by the agent, not counted
    CHECK_FALSE(table("events").entries);   // a ring, not a table
}
