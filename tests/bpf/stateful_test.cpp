// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Selectors that read flow state: token, sequence (subflow and data), flow_bytes. The state is
// built the way the datapath builds it (SYNs through the entry program, keys through
// get_connect and the event reader) or, where noted, written into the flow map directly.
#include <catch2/catch.hpp>

#include <bpf/bpf.h>

#include <cstring>

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

// Runs one packet through a "... -> selector at `sel_pc` -> drop" chain and checks the
// verdict, that the frame is untouched and the selector's counters.
void expect_match(Env& env, Hook h, const Packet& p, bool match, size_t sel_pc = 0) {
    Bytes in = p.build();
    Snap before = Snap::of(env);
    Run r = env.run(h, in);
    Snap after = Snap::of(env);
    CHECK(r.retval == retval_of(match ? Verdict::drop : Verdict::pass, h));
    if (r.out != in) FAIL_CHECK("frame modified\n" << describe_frame(r.out, in));
    auto s = step_delta(before, after, sel_pc);
    CHECK(s.runs == 1);
    CHECK(s.matched == (match ? 1u : 0u));
    CHECK(gen_delta(before, after, MPS_GC_MALFORMED) == 0);
}

}  // namespace

// ---- token ------------------------------------------------------------------------------------

TEST_CASE("selector token: learnt from an MP_JOIN SYN", "[bpf][selector][state]") {
    const uint32_t tok = 0xc0ffee01;
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(probe(sel_token(tok)));
            // no flow yet
            expect_match(env, h, cli(v6).payload(5), false);
            // the SYN itself: the entry program learns the token before the chain runs
            expect_match(env, h, cli(v6).flags(tcpf::SYN).option(mptcp::join_syn(tok, 1)), true);
            expect_match(env, h, cli(v6).payload(5), true);
            expect_match(env, h, srv(v6).payload(5), true);          // either direction
            expect_match(env, h, cli(v6, 40001).payload(5), false);  // another subflow
            env.set_step(0, sel_token(tok + 1, 1, END));
            expect_match(env, h, cli(v6).payload(5), false);
            env.set_step(0, sel_token(0, 1, END));  // 0 names no connection
            expect_match(env, h, cli(v6).payload(5), false);
        }
    }
}

TEST_CASE("selector token: survives the MP_JOIN SYN/ACK", "[bpf][selector][state]") {
    const uint32_t tok = 0xc0ffee01;
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(probe(sel_token(tok)));
        env.run(h, cli(false).flags(tcpf::SYN).option(mptcp::join_syn(tok, 1)));
        env.run(h, srv(false).flags(tcpf::SYN | tcpf::ACK).option(mptcp::join_synack(2, 3)));
        expect_match(env, h, cli(false).option(mptcp::join_ack({})), true);
    }
}

TEST_CASE("selector token: tokens derived from MP_CAPABLE keys", "[bpf][selector][state]") {
    const uint64_t ka = 0xaaaa000011112222, kb = 0xbbbb333344445555;
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            // get_connect -> token -> drop
            Env env(chain_of({step(MPS_ACT_GET_CONNECT, 1), sel_token(token_of(ka), 2, END),
                              step(MPS_ACT_DROP)}));
            env.run(h, cli(v6).flags(tcpf::SYN).option(mptcp::capable_syn()));
            expect_match(env, h, cli(v6).option(mptcp::capable_ack(ka, kb)), false, 1);
            env.events();  // the agent side derives the tokens
            expect_match(env, h, cli(v6).payload(10), true, 1);
            env.set_step(1, sel_token(token_of(kb), 2, END));
            expect_match(env, h, srv(v6).payload(10), true, 1);
            env.set_step(1, sel_token(token_of(kb) ^ 1, 2, END));
            expect_match(env, h, srv(v6).payload(10), false, 1);
        }
    }
}

// ---- sequence (subflow) -------------------------------------------------------------------------

TEST_CASE("selector sequence(subflow): relative to the ISN from the SYN",
          "[bpf][selector][state]") {
    struct C {
        std::string name;
        uint32_t isn;
        uint32_t seq;
        uint64_t lo, hi;
        bool match;
    };
    std::vector<C> t = {
        {"first data byte", 1000, 1001, 1, 2, true},
        {"below the range", 1000, 1001, 2, 100, false},
        {"at hi (exclusive)", 1000, 1101, 1, 101, false},
        {"just below hi", 1000, 1100, 1, 101, true},
        {"far into the flow", 1000, 1000 + 100000, 100000, 200000, true},
        {"sequence wrapped past 2^32", 0xffffff00u, 0x100, 0x200, 0x201, true},
        {"the SYN itself is 0", 77, 77, 0, 1, true},
    };
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            Env env(probe(sel_seq(MPS_SEQ_SUBFLOW, 0, 1)));
            uint16_t port = 20000;
            for (const C& c : t) {
                INFO((v6 ? "v6 " : "v4 ") << name_of(h) << ": " << c.name);
                env.set_step(0, sel_seq(MPS_SEQ_SUBFLOW, c.lo, c.hi, 1, END));
                Packet syn = cli(v6, port).flags(tcpf::SYN).seq(c.isn);
                // SYN first (it is its own case when seq == isn)
                if (c.seq == c.isn) {
                    expect_match(env, h, syn, c.match);
                } else {
                    env.run(h, syn);
                    expect_match(env, h, cli(v6, port).seq(c.seq).payload(10), c.match);
                }
                port++;
            }
            // no SYN seen: no ISN, no match
            env.set_step(0, sel_seq(MPS_SEQ_SUBFLOW, 0, ~0ull, 1, END));
            expect_match(env, h, cli(v6, 29999).seq(5).payload(1), false);
            // the server's direction counts from the server's SYN/ACK
            env.run(h, srv(v6, 29998).flags(tcpf::SYN | tcpf::ACK).seq(5000).ack(1));
            env.set_step(0, sel_seq(MPS_SEQ_SUBFLOW, 51, 52, 1, END));
            expect_match(env, h, srv(v6, 29998).seq(5051).payload(10), true);
            expect_match(env, h, srv(v6, 29998).seq(5052).payload(10), false);
        }
    }
}

TEST_CASE("selector sequence(subflow): client side after the SYN/ACK", "[bpf][selector][state]") {
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(probe(sel_seq(MPS_SEQ_SUBFLOW, 100, 101)));
        env.run(h, cli(false).flags(tcpf::SYN).seq(1000));
        env.run(h, srv(false).flags(tcpf::SYN | tcpf::ACK).seq(5000).ack(1001));
        expect_match(env, h, cli(false).seq(1100).payload(10), true);
    }
}

// ---- sequence (data) ----------------------------------------------------------------------------

namespace {

struct DsnCase {
    std::string name;
    mptcp::Dss dss;  // DSN given relative: the IDSN is added below
    uint64_t lo, hi;
    bool match;
    const char* bug = nullptr;
};

std::vector<DsnCase> dsn_cases() {
    using mptcp::Dss;
    return {
        {"ack8 + dsn8", Dss().ack(1).map(501, 1, 10), 501, 502, true},
        {"ack8 + dsn8, below", Dss().ack(1).map(500, 1, 10), 501, 600, false},
        {"ack8 + dsn8, at hi", Dss().ack(1).map(600, 1, 10), 501, 600, false},
        {"ack8 + dsn8 + checksum", Dss().ack(1).map(501, 1, 10).csum(0x1234), 500, 502, true},
        {"ack4 + dsn8", Dss().ack(1, false).map(70000, 1, 10), 70000, 70001, true},
        {"ack8 + dsn4", Dss().ack(1).map(501, 1, 10, false), 501, 502, true},
        {"no mapping", Dss().ack(1), 0, ~0ull, false},
        {"dsn8 without data ack (len 18)", Dss().map(501, 1, 10), 501, 502, true, "B3"},
        {"dsn4 without data ack (len 14)", Dss().map(501, 1, 10, false), 501, 502, true, "B3"},
        {"ack4 + dsn4 (len 18)", Dss().ack(1, false).map(501, 1, 10, false), 501, 502, true, "B3"},
    };
}

// Flow with known IDSNs, written into the flow map after the SYN created the entry.
void seed_idsn(Env& env, Hook h, bool v6, uint16_t port, uint64_t idsn_c, uint64_t idsn_s) {
    env.run(h, cli(v6, port).flags(tcpf::SYN).seq(1));
    bool client_is_a = false;
    auto k = flow_key_of(cli(v6, port), &client_is_a);
    auto f = env.flow(k);
    REQUIRE(f);
    f->idsn[client_is_a ? 0 : 1] = idsn_c;
    f->idsn[client_is_a ? 1 : 0] = idsn_s;
    env.put_flow(k, *f);
}

void run_dsn_cases(bool known_bugs) {
    const uint64_t idsn_c = 0xfffffffffffff000ull, idsn_s = 0x0000000100000010ull;
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            Env env(probe(sel_seq(MPS_SEQ_DATA, 0, 1)));
            uint16_t port = 21000;
            for (DsnCase c : dsn_cases()) {
                if ((c.bug != nullptr) != known_bugs) continue;
                for (bool from_client : {true, false}) {
                    INFO((v6 ? "v6 " : "v4 ") << name_of(h) << ": " << c.name
                                              << (from_client ? " (client)" : " (server)"));
                    seed_idsn(env, h, v6, port, idsn_c, idsn_s);
                    env.set_step(0, sel_seq(MPS_SEQ_DATA, c.lo, c.hi, 1, END));
                    mptcp::Dss d = c.dss;
                    if (d.dsn) {
                        uint64_t abs = (from_client ? idsn_c : idsn_s) + *d.dsn;
                        d.dsn = d.dsn8 ? abs : (abs & 0xffffffff);
                    }
                    Packet p = from_client ? cli(v6, port) : srv(v6, port);
                    expect_match(env, h, p.option(mptcp::dss(d)).payload(10), c.match);
                    port++;
                }
            }
            if (known_bugs) continue;
            // IDSN unknown (keys never seen): no match
            env.set_step(0, sel_seq(MPS_SEQ_DATA, 0, ~0ull, 1, END));
            env.run(h, cli(v6, 29000).flags(tcpf::SYN));
            expect_match(
                env, h,
                cli(v6, 29000).option(mptcp::dss(mptcp::Dss().ack(1).map(5, 1, 1))).payload(1),
                false);
            // no DSS at all
            seed_idsn(env, h, v6, 29001, idsn_c, idsn_s);
            expect_match(env, h, cli(v6, 29001).payload(1), false);
        }
    }
}

}  // namespace

TEST_CASE("selector sequence(data): DSN relative to the IDSN, DSS variants",
          "[bpf][selector][state]") {
    run_dsn_cases(false);
}

// Was B3 in NOTES-bpf-tests.md.
TEST_CASE("selector sequence(data): DSS options shorter than 20 bytes", "[bpf][selector][state]") {
    run_dsn_cases(true);
}

TEST_CASE("selector sequence(data): IDSN from the MP_CAPABLE keys", "[bpf][selector][state]") {
    const uint64_t ka = 0x0102030405060708, kb = 0x1112131415161718;
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_GET_CONNECT, 1), sel_seq(MPS_SEQ_DATA, 1, 11, 2, END),
                          step(MPS_ACT_DROP)}));
        env.run(h, cli(false).flags(tcpf::SYN).option(mptcp::capable_syn()));
        env.run(h, srv(false).flags(tcpf::SYN | tcpf::ACK).option(mptcp::capable_synack(kb)));
        env.run(h, cli(false).option(mptcp::capable_ack(ka, kb)));
        env.events();
        using mptcp::Dss;
        expect_match(
            env, h,
            cli(false).option(mptcp::dss(Dss().ack(1).map(idsn_of(ka) + 1, 1, 10))).payload(10),
            true, 1);
        expect_match(
            env, h,
            cli(false).option(mptcp::dss(Dss().ack(1).map(idsn_of(ka) + 11, 1, 10))).payload(10),
            false, 1);
        expect_match(
            env, h,
            srv(false).option(mptcp::dss(Dss().ack(1).map(idsn_of(kb) + 10, 1, 10))).payload(10),
            true, 1);
        // the other side's IDSN does not apply
        expect_match(
            env, h,
            srv(false).option(mptcp::dss(Dss().ack(1).map(idsn_of(ka) + 5, 1, 10))).payload(10),
            false, 1);
    }
}

// ---- flow_bytes
// -----------------------------------------------------------------------------------

TEST_CASE("selector flow_bytes(subflow): bytes seen before this packet, both directions",
          "[bpf][selector][state]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(probe(sel_bytes(MPS_BYTES_SUBFLOW, 200, 300)));
            expect_match(env, h, cli(v6).payload(100), false);  // 0 before
            expect_match(env, h, srv(v6).payload(60), false);   // 100
            expect_match(env, h, cli(v6).payload(40), false);   // 160
            expect_match(env, h, cli(v6), true);                // 200
            expect_match(env, h, srv(v6).payload(99), true);    // 200
            expect_match(env, h, cli(v6).payload(1), true);     // 299
            auto f = env.flow(cli(v6));
            REQUIRE(f);
            CHECK(f->dir_ab.bytes + f->dir_ba.bytes == 300);
            expect_match(env, h, cli(v6).payload(1), false);         // 300 (hi is exclusive)
            expect_match(env, h, cli(v6, 40001).payload(1), false);  // another subflow: 0
        }
    }
}

TEST_CASE(
    "selector flow_bytes(connection): a connection linked late counts all its subflow carried",
    "[bpf][selector][state]") {
    // The agent creates the connection entry after the first packets: the subflow has carried
    // 900 bytes, the fresh entry none. The flow hands over everything it counted.
    const uint32_t tok = 0x00c0ffee;
    for (Hook h : kCaseHooks) {
        INFO(name_of(h));
        Env env(chain_of({step(MPS_ACT_RECORD, 1), sel_bytes(MPS_BYTES_CONN, 1000, 1100, 2, END),
                          step(MPS_ACT_DROP)}));
        env.run(h, cli(false).flags(tcpf::SYN));
        expect_match(env, h, cli(false).payload(900), false, 1);  // 900 counted unlinked
        mps_conn c{};
        c.token[0] = tok;
        c.token[1] = tok + 1;
        REQUIRE(bpf_map_update_elem(env.state().conns(), &tok, &c, BPF_ANY) == 0);
        auto k = flow_key_of(cli(false));
        auto f = env.flow(k);
        REQUIRE(f);
        f->conn_token = tok;
        env.put_flow(k, *f);
        expect_match(env, h, cli(false).payload(150), false, 1);  // 900 before it
        expect_match(env, h, cli(false).payload(10), true, 1);    // 1050
        next_clock_tick();
        expect_match(env, h, cli(false).payload(5), true, 1);  // 1060
        auto conn = env.conn(tok);
        REQUIRE(conn);
        CHECK(conn->bytes == 1065);
        CHECK(conn->packets == 5);  // the SYN too
    }
}

TEST_CASE("actor record: a linked flow hands its counts to the connection at the tick and at a FIN",
          "[bpf][actor][state]") {
    // Not per packet (that would be a second hash lookup on each): what the entry lacks at any
    // moment is what the flow counted since it last handed over, from both hooks' packets.
    const uint32_t tok = 0x00c0ffee;
    for (bool rst : {false, true}) {
        INFO((rst ? "RST" : "FIN"));
        Env env(chain_of({step(MPS_ACT_RECORD)}));
        mps_conn c{};
        c.token[0] = tok;
        c.token[1] = tok + 1;
        c.bytes = 7;  // another subflow's, handed over before
        c.packets = 1;
        REQUIRE(bpf_map_update_elem(env.state().conns(), &tok, &c, BPF_ANY) == 0);
        env.run(Hook::tc_egress, cli(false).flags(tcpf::SYN));
        auto k = flow_key_of(cli(false));
        auto f = env.flow(k);
        REQUIRE(f);
        f->conn_token = tok;
        env.put_flow(k, *f);
        auto held_with_flow = [&] {
            auto cn = env.conn(tok);
            auto fl = env.flow(k);
            REQUIRE(cn);
            REQUIRE(fl);
            CHECK(fl->conn_bytes <= fl->dir_ab.bytes + fl->dir_ba.bytes);
            return std::pair<uint64_t, uint64_t>{
                cn->bytes + fl->dir_ab.bytes + fl->dir_ba.bytes - fl->conn_bytes,
                cn->packets + fl->dir_ab.packets + fl->dir_ba.packets - fl->conn_packets};
        };
        uint64_t bytes = 7, packets = 2;  // with the SYN
        // Packets from both hooks, some within one tick, some across.
        for (int i = 0; i < 20; ++i) {
            env.run(i % 2 ? Hook::xdp : Hook::tc_egress,
                    (i % 2 ? srv(false) : cli(false)).payload(100 + i));
            bytes += 100 + i;
            ++packets;
            CHECK(held_with_flow() == std::pair<uint64_t, uint64_t>{bytes, packets});
            if (i % 7 == 6) next_clock_tick();
        }
        next_clock_tick();
        env.run(Hook::xdp, srv(false).payload(40));  // first of a tick: hands over
        bytes += 40;
        ++packets;
        auto conn = env.conn(tok);
        REQUIRE(conn);
        CHECK(conn->bytes == bytes);
        CHECK(conn->packets == packets);
        env.run(Hook::tc_egress, cli(false).payload(3));  // the same tick: the flow keeps it
        env.run(Hook::tc_egress, cli(false).flags(rst ? tcpf::RST : tcpf::FIN | tcpf::ACK));
        conn = env.conn(tok);
        REQUIRE(conn);
        CHECK(conn->bytes == bytes + 3);
        CHECK(conn->packets == packets + 2);
    }
}

TEST_CASE("selector flow_bytes(connection): bytes of every subflow of the connection",
          "[bpf][selector][state]") {
    const uint32_t tok = 0x00c0ffee;
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "v6 " : "v4 ") << name_of(h));
            Env env(chain_of({step(MPS_ACT_RECORD, 1),
                              sel_bytes(MPS_BYTES_CONN, 1000, 1100, 2, END), step(MPS_ACT_DROP)}));
            // two subflows of one connection, linked through conn_token, 1000 bytes before
            mps_conn c{};
            c.token[0] = tok;
            c.token[1] = tok + 1;
            c.bytes = 1000;
            c.subflows = 2;
            REQUIRE(bpf_map_update_elem(env.state().conns(), &tok, &c, BPF_ANY) == 0);
            for (uint16_t port : {40000, 40001}) {
                env.run(h, cli(v6, port).flags(tcpf::SYN));
                auto k = flow_key_of(cli(v6, port));
                auto f = env.flow(k);
                REQUIRE(f);
                f->conn_token = tok;
                env.put_flow(k, *f);
            }
            // Each packet the first of its tick, so each subflow has handed over the others'
            // bytes before the next reads the connection.
            next_clock_tick();
            expect_match(env, h, cli(v6, 40000).payload(60), true, 1);  // 1000 before
            next_clock_tick();
            expect_match(env, h, srv(v6, 40001).payload(30), true, 1);  // 1060
            next_clock_tick();
            expect_match(env, h, cli(v6, 40001).payload(20), true, 1);  // 1090
            next_clock_tick();
            expect_match(env, h, cli(v6, 40000).payload(1), false, 1);  // 1110
            auto conn = env.conn(tok);
            REQUIRE(conn);
            CHECK(conn->bytes == 1111);
            CHECK(conn->packets == 6);  // the SYNs too
        }
    }
}
