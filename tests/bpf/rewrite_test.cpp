// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The option-rewriting actors (bpf/lib/rewrite.h and its actors) on exact bytes: each case gives
// the input frame and the frame expected out, built independently with the packet builder, runs
// through XDP and TC, and checks verdicts, both checksums, counters and the actor's maps.
#include <catch2/catch.hpp>

#include <bpf/bpf.h>
#include <net/if.h>
#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "bpf_env.h"
#include "datapath/actors.h"

using namespace mpsteer::test;
namespace dp = mpsteer::datapath;

namespace {

constexpr const char* C4 = "10.1.0.1";
constexpr const char* S4 = "10.2.0.2";
constexpr const char* C6 = "2001:db8:1::1";
constexpr const char* S6 = "2001:db8:2::2";
constexpr uint64_t kHmac = 0x1122334455667788ull;

Bytes ts_opt(uint32_t val = 0x01020304, uint32_t ecr = 0x0a0b0c0d) {
    Bytes b = opt::nop();
    Bytes n = opt::nop();
    b.insert(b.end(), n.begin(), n.end());
    Bytes t = opt::timestamps(val, ecr);
    b.insert(b.end(), t.begin(), t.end());
    return b;
}

// The server (announcer) towards the client, on the initial subflow.
Packet from_server(bool v6) {
    Packet p = v6 ? Packet::v6(S6, 80, C6, 40000) : Packet::v4(S4, 80, C4, 40000);
    return p.seq(5000).ack(7000).window(500);
}

Bytes announce(bool v6, bool port, bool echo = false, uint64_t hmac = kHmac, uint8_t id = 1) {
    std::optional<uint16_t> pt;
    if (port) pt = 8080;
    return v6 ? mptcp::add_addr(ip6("2001:db8:3::2"), id, pt, echo, hmac)
              : mptcp::add_addr(ip4("10.3.0.2"), id, pt, echo, hmac);
}

// The HMAC with the byte blk_subflow flips (the first even-offset byte of the HMAC, given the
// option's offset in the TCP header) inverted.
uint64_t flipped(uint64_t hmac, size_t opt_off, size_t len) {
    size_t b = (opt_off + len - 8 + 1) & ~size_t(1);
    size_t i = b - (opt_off + len - 8);  // 0 or 1: index into the HMAC
    return hmac ^ (uint64_t(0xff) << (56 - 8 * i));
}

void check_frame(const Run& r, const Bytes& want) {
    if (r.out != want) FAIL_CHECK("frame differs\n" << describe_frame(r.out, want));
    CHECK(checksum_errors(r.out) == "");
}

// Runs `fn` in a thread inside a fresh network namespace (loopback up): what add_subflow
// clones back into a hook during BPF_PROG_TEST_RUN lands on that namespace's lo, not on the
// machine's.
void in_private_netns(const std::function<void()>& fn) {
    std::string error;
    std::thread t([&] {
        try {
            if (unshare(CLONE_NEWNET) != 0)
                throw std::runtime_error("unshare(CLONE_NEWNET) failed");
            if (std::system("ip link set lo up") != 0)
                throw std::runtime_error("ip link set lo up failed");
            fn();
        } catch (const std::exception& e) {
            error = e.what();
        }
    });
    t.join();
    if (!error.empty()) FAIL(error);
}

// TC test run with an skb context (mark, ifindex).
Run tc_run(int prog_fd, const Bytes& frame, uint32_t mark) {
    Bytes out(frame.size() + 512);
    __sk_buff ctx{};
    ctx.mark = mark;
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = out.data(),
                .data_size_in = uint32_t(frame.size()), .data_size_out = uint32_t(out.size()),
                .ctx_in = &ctx, .ctx_size_in = sizeof ctx);
    if (bpf_prog_test_run_opts(prog_fd, &opts) != 0)
        throw std::runtime_error(std::string("test run: ") + std::strerror(errno));
    out.resize(opts.data_size_out);
    return {opts.retval, out};
}

mps_step backup_step(bool b, bool every = false) {
    mps_step s = step(MPS_ACT_SET_BACKUP);
    s.p.backup.backup = b;
    s.p.backup.every_packet = every;
    return s;
}

}  // namespace

TEST_CASE("rewrite: every rewriting actor loads and verifies", "[bpf][rewrite]") {
    mps_step rd = step(MPS_ACT_REDIRECT, 5);
    Env env(chain_of({step(MPS_ACT_BLK_SUBFLOW, 1), step(MPS_ACT_ADD_SUBFLOW, 2),
                      backup_step(true, false), step(MPS_ACT_NO_SUBFLOWS, 4), rd,
                      step(MPS_ACT_PASS), step(MPS_ACT_REJECT)}));
    for (const char* p : {"act_blk_subflow", "act_add_subflow", "act_set_backup", "act_no_subflows",
                          "act_redirect", "act_reject"})
        for (const char* s : {"_xdp", "_tc"})
            CHECK(env.generation().prog_fd(std::string(p) + s) >= 0);
}

TEST_CASE("rewrite: blk_subflow invalidates the ADD_ADDR HMAC, stores it, hides retransmissions",
          "[bpf][rewrite][blk_subflow]") {
    Env env(chain_of({step(MPS_ACT_BLK_SUBFLOW)}));
    auto maps = dp::ActorMaps::of(env.generation());
    struct Case {
        const char* name;
        bool v6, port;
        int prefix;  // 0: none, 1: NOP (odd offset), 2: NOP NOP timestamps
    };
    // (IPv6 with a port is 30 bytes: no room left for the timestamps.)
    const Case cases[] = {
        {"IPv4", false, false, 2},
        {"IPv4 with port", false, true, 2},
        {"IPv6", true, false, 2},
        {"IPv6 with port", true, true, 0},
        {"IPv4, odd offset", false, false, 1},
        {"IPv6 with port, odd offset", true, true, 1},
        {"IPv4 with port, first option", false, true, 0},
    };
    uint16_t sport = 1000;
    for (const auto& c : cases) {
        for (Hook h : kCaseHooks) {
            INFO(c.name << " via " << name_of(h));
            // A fresh flow per case: announcements are per flow and address id.
            Packet in = from_server(c.v6);
            in.tcp.sport = sport++;
            Packet want = in;
            Bytes ann = announce(c.v6, c.port);
            size_t off = 20;
            if (c.prefix == 1) {
                in.option(opt::nop());
                want.option(opt::nop());
                off += 1;
            } else if (c.prefix == 2) {
                in.option(ts_opt());
                want.option(ts_opt());
                off += 12;
            }
            in.option(ann);
            want.option(announce(c.v6, c.port, false, flipped(kHmac, off, ann.size())));
            Bytes frame = in.build();
            REQUIRE(verify_checksums(frame));
            Snap s0 = Snap::of(env);
            Run r = env.run(h, frame);
            Snap s1 = Snap::of(env);
            CHECK(r.retval == retval_of(Verdict::pass, h));
            check_frame(r, want.build());
            CHECK(step_delta(s0, s1, 0).matched == 1);
            CHECK(gen_delta(s0, s1, MPS_GC_MALFORMED) == 0);

            mps_announce_key k{};
            bool from_a = false;
            k.flow = flow_key_of(in, &from_a);
            k.addr_id = 1;
            auto a = maps.find(k);
            REQUIRE(a);
            CHECK(a->value.state == MPS_ANN_BLOCKED);
            CHECK(a->value.hidden == 1);
            CHECK(a->value.family == (c.v6 ? 6 : 4));
            CHECK(a->value.port == (c.port ? 8080 : 0));
            CHECK(a->value.len == ann.size());
            CHECK(a->value.from_a == from_a);
            CHECK(a->value.hook == uint8_t(h));
            CHECK(Bytes(a->value.opt, a->value.opt + ann.size()) == ann);  // HMAC intact
            CHECK(a->address() == (c.v6 ? (c.port ? "[2001:db8:3::2]:8080" : "2001:db8:3::2")
                                        : (c.port ? "10.3.0.2:8080" : "10.3.0.2")));

            // The retransmission: hidden the same way, counted.
            r = env.run(h, frame);
            check_frame(r, want.build());
            CHECK(maps.find(k)->value.hidden == 2);
        }
    }
    // One event per announcement, with the address; retransmissions make none.
    auto evs = env.events();
    size_t n = 0;
    for (const auto& e : evs)
        if (e.raw.type == MPS_EV_ADD_ADDR_BLOCKED) {
            n++;
            CHECK(e.raw.addr_id == 1);
            CHECK((e.raw.flags == 4 || e.raw.flags == 6));
        }
    CHECK(n == std::size(cases) * kCaseHooks.size());
}

TEST_CASE("rewrite: blk_subflow hides the ADD_ADDR the kernel keeps when a segment has several",
          "[bpf][rewrite][blk_subflow]") {
    Env env(chain_of({step(MPS_ACT_BLK_SUBFLOW)}));
    auto maps = dp::ActorMaps::of(env.generation());
    const Bytes a1 = announce(false, false, false, kHmac, 1);  // 16 bytes, id 1
    const Bytes a2 = mptcp::add_addr(ip4("10.4.0.2"), 2, std::nullopt, false, kHmac);  // id 2
    const Bytes echo = announce(false, false, true, 0, 7);                             // 8 bytes
    Bytes bad_len = a1;  // a length no ADD_ADDR has: the kernel skips it
    bad_len.push_back(0);
    bad_len[1] = uint8_t(bad_len.size());
    struct Case {
        const char* name;
        std::vector<Bytes> options;
        int hidden;  // index into options of the one the kernel acts on; -1: none
        uint8_t id;
    };
    const Case cases[] = {
        {"two announcements: the second", {a1, a2}, 1, 2},
        {"an echo, then two announcements: the last", {echo, a1, a2}, 2, 2},
        {"an announcement, then an echo: none (the kernel takes the echo)", {a1, echo}, -1, 0},
        {"an announcement, then one of a bad length: the first", {a1, bad_len}, 0, 1},
    };
    uint16_t sport = 2000;
    for (const auto& c : cases) {
        for (Hook h : kCaseHooks) {
            INFO(c.name << " via " << name_of(h));
            Packet in = from_server(false);
            in.tcp.sport = sport++;
            Packet want = in;
            size_t off = 20;
            for (size_t i = 0; i < c.options.size(); ++i) {
                in.option(c.options[i]);
                if (int(i) == c.hidden) {
                    Bytes w = c.options[i];
                    const uint64_t f = flipped(kHmac, off, w.size());
                    for (int b = 0; b < 8; ++b) w[w.size() - 8 + b] = uint8_t(f >> (56 - 8 * b));
                    want.option(w);
                } else {
                    want.option(c.options[i]);
                }
                off += c.options[i].size();
            }
            Bytes frame = in.build();
            REQUIRE(verify_checksums(frame));
            Run r = env.run(h, frame);
            CHECK(r.retval == retval_of(Verdict::pass, h));
            check_frame(r, want.build());
            mps_announce_key k{};
            k.flow = flow_key_of(in);
            for (uint8_t id : {uint8_t(1), uint8_t(2), uint8_t(7)}) {
                k.addr_id = id;
                CHECK(maps.find(k).has_value() == (c.hidden >= 0 && id == c.id));
            }
        }
    }
}

TEST_CASE("rewrite: blk_subflow leaves echoes, other options and released announcements alone",
          "[bpf][rewrite][blk_subflow]") {
    Env env(chain_of({step(MPS_ACT_BLK_SUBFLOW)}));
    auto maps = dp::ActorMaps::of(env.generation());
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "IPv6" : "IPv4") << " via " << name_of(h));
            std::vector<std::pair<const char*, Packet>> untouched = {
                {"echo", from_server(v6).option(ts_opt()).option(announce(v6, false, true))},
                {"echo with port", from_server(v6).option(announce(v6, true, true))},
                {"DSS only",
                 from_server(v6).option(ts_opt()).option(mptcp::dss(mptcp::Dss{}.ack(1234)))},
                {"plain TCP", from_server(v6).option(ts_opt()).payload(100)},
                {"ADD_ADDR of a length v1 does not define",
                 from_server(v6).option(opt::raw(30, {0x30, 1, 10, 3, 0, 2, 0, 0, 0, 0}))},
            };
            for (auto& [what, p] : untouched) {
                INFO(what);
                Bytes f = p.build();
                Run r = env.run(h, f);
                CHECK(r.retval == retval_of(Verdict::pass, h));
                check_frame(r, f);
            }
        }
    }
    CHECK(maps.announcements().empty());

    // Malformed options: passed untouched and counted, nothing stored.
    Packet bad = from_server(false).option(announce(false, false));
    bad.tcp.options[1] = 40;  // the ADD_ADDR claims to run past the header
    Bytes f = bad.build();
    for (Hook h : kCaseHooks) {
        Snap s0 = Snap::of(env);
        Run r = env.run(h, f);
        CHECK(r.out == f);
        CHECK(gen_delta(s0, Snap::of(env), MPS_GC_MALFORMED) == 1);
    }
    CHECK(maps.announcements().empty());

    // Released: the host is meant to learn it; copies pass untouched from then on.
    Packet p = from_server(false).option(ts_opt()).option(announce(false, false));
    Bytes in = p.build();
    env.run(Hook::xdp, in);
    auto all = maps.announcements();
    REQUIRE(all.size() == 1);
    mps_announce_key k = all[0].key;
    mps_announce v = all[0].value;
    v.state = MPS_ANN_RELEASED;
    REQUIRE(bpf_map_update_elem(env.generation().map_fd("announces"), &k, &v, BPF_EXIST) == 0);
    check_frame(env.run(Hook::xdp, in), in);
    maps.block_again(k);
    CHECK(env.run(Hook::xdp, in).out != in);
}

TEST_CASE("rewrite: blk_subflow keeps every announcement when the event ring is full",
          "[bpf][rewrite][blk_subflow]") {
    Env env(chain_of({step(MPS_ACT_BLK_SUBFLOW)}));
    auto maps = dp::ActorMaps::of(env.generation());
    // The ring holds 256 KiB; events are ~100 bytes: 3000 announcements overflow it while
    // nobody reads.
    const int n = 3000;
    Snap s0 = Snap::of(env);
    for (int i = 0; i < n; i++) {
        Packet p = from_server(false).option(ts_opt()).option(announce(false, false));
        p.tcp.sport = uint16_t(2000 + i);
        env.run(Hook::xdp, p.build());
    }
    Snap s1 = Snap::of(env);
    CHECK(gen_delta(s0, s1, MPS_GC_EVENTS_LOST) > 0);
    CHECK(maps.announcements().size() == size_t(n));
}

TEST_CASE("rewrite: set_backup appends MP_PRIO to pure ACKs, once per subflow and direction",
          "[bpf][rewrite][set_backup]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "IPv6" : "IPv4") << " via " << name_of(h));
            Env env(chain_of({backup_step(true)}));
            auto maps = dp::ActorMaps::of(env.generation());
            auto ack = [&](uint32_t seq) {
                return from_server(v6).seq(seq).option(ts_opt()).option(
                    mptcp::dss(mptcp::Dss{}.ack(0x0102030405060708ull)));
            };
            auto with_prio = [&](Packet p, bool b) {
                return p.option(opt::nop()).option(mptcp::mp_prio(b));
            };
            Run r = env.run(h, ack(1).build());
            CHECK(r.retval == retval_of(Verdict::pass, h));
            check_frame(r, with_prio(ack(1), true).build());
            auto ps = maps.prio_sent(flow_key_of(ack(1)));
            REQUIRE(ps);
            bool from_a = false;
            flow_key_of(ack(1), &from_a);
            CHECK(ps->sent[from_a ? 0 : 1] == 2);
            // One-shot: the next ACK goes untouched...
            check_frame(env.run(h, ack(2).build()), ack(2).build());
            // The other direction has its own one-shot signal.
            Packet rev = ack(3).reversed().seq(9).option(ts_opt());
            check_frame(env.run(h, rev.build()), with_prio(rev, true).build());
            // B=0 in place (as the agent would): signalled once more, with B=0.
            env.set_step(0, backup_step(false));
            check_frame(env.run(h, ack(4).build()), with_prio(ack(4), false).build());
            check_frame(env.run(h, ack(5).build()), ack(5).build());
            // every_packet: on each pure ACK.
            env.set_step(0, backup_step(true, true));
            check_frame(env.run(h, ack(6).build()), with_prio(ack(6), true).build());
            check_frame(env.run(h, ack(7).build()), with_prio(ack(7), true).build());

            // Never into: data, SYN, FIN, RST, a header with no room, a frame with a trailer,
            // a packet that already has MP_PRIO, malformed options.
            std::vector<std::pair<const char*, Packet>> untouched = {
                {"data", ack(8).payload(100)},
                {"SYN", from_server(v6).flags(tcpf::SYN).option(mptcp::capable_syn())},
                {"FIN", ack(9).flags(tcpf::FIN | tcpf::ACK)},
                {"RST", ack(10).flags(tcpf::RST | tcpf::ACK)},
                {"40 bytes of options", ack(11).option(opt::raw(253, Bytes(14, 0)))},
                {"MP_PRIO already", with_prio(ack(12), false)},
            };
            Packet trailer = ack(13);
            trailer.trailer = Bytes(6, 0);
            untouched.push_back({"Ethernet trailer", trailer});
            Packet bad = ack(14);
            bad.tcp.options[13] = 30;  // DSS length past the header
            untouched.push_back({"malformed", bad});
            for (auto& [what, p] : untouched) {
                INFO(what);
                Bytes f = p.build();
                Run rr = env.run(h, f);
                CHECK(rr.retval == retval_of(Verdict::pass, h));
                CHECK(rr.out == f);
            }
        }
    }
}

TEST_CASE(
    "rewrite: set_backup keeps a template of each subflow direction's latest ACK and "
    "builds the pure ACK that carries MP_PRIO on an idle subflow",
    "[bpf][rewrite][set_backup]") {
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "IPv6" : "IPv4") << " via " << name_of(h));
            Env env(chain_of({backup_step(true)}));
            auto maps = dp::ActorMaps::of(env.generation());
            auto dss = mptcp::dss(mptcp::Dss{}.ack(0x0102030405060708ull));
            // A data segment (no MP_PRIO for it), then a FIN: the template follows the latest.
            Packet data = from_server(v6).seq(1000).option(ts_opt(77, 88)).option(dss).payload(100);
            Bytes f = data.build();
            CHECK(env.run(h, f).out == f);
            auto tmpls = maps.prio_templates();
            REQUIRE(tmpls.size() == 1);
            bool from_a = false;
            {
                auto fk = flow_key_of(data, &from_a);
                CHECK(std::memcmp(&tmpls[0].key.flow, &fk, sizeof fk) == 0);
            }
            CHECK(tmpls[0].key.dir == (from_a ? 0 : 1));
            const auto& t = tmpls[0].value;
            CHECK(t.pc == 0);
            CHECK(t.hook == uint8_t(h == Hook::xdp ? MPS_HOOK_XDP : MPS_HOOK_TC_EGRESS));
            CHECK(t.family == (v6 ? 6 : 4));
            CHECK(t.next == 100);
            CHECK(t.len == f.size() - 100);
            CHECK(t.ns > 0);
            // The follower: seq + 100, ACK only, NOP NOP TS (the template's) + NOP + MP_PRIO.
            auto follower = [&](uint32_t seq, bool b) {
                return from_server(v6)
                    .seq(seq)
                    .option(ts_opt(77, 88))
                    .option(opt::nop())
                    .option(mptcp::mp_prio(b))
                    .build();
            };
            Bytes b0 = dp::prio_frame(t, false);
            if (b0 != follower(1100, false))
                FAIL_CHECK("frame differs\n" << describe_frame(b0, follower(1100, false)));
            CHECK(checksum_errors(b0) == "");
            CHECK(dp::prio_frame(t, true) == follower(1100, true));
            // A FIN counts one sequence number; a pure ACK none.
            Packet fin =
                from_server(v6).seq(1100).flags(tcpf::FIN | tcpf::ACK).option(ts_opt(78, 88));
            env.run(h, fin.build());
            CHECK(dp::prio_frame(maps.prio_templates().at(0).value, false) ==
                  from_server(v6)
                      .seq(1101)
                      .option(ts_opt(78, 88))
                      .option(opt::nop())
                      .option(mptcp::mp_prio(false))
                      .build());
            // Without timestamps: NOP + MP_PRIO only. The other direction has its own template.
            Packet rev = from_server(v6).reversed().seq(9).ack(1101);
            env.run(h, rev.build());
            tmpls = maps.prio_templates();
            REQUIRE(tmpls.size() == 2);
            for (const auto& x : tmpls)
                if (x.key.dir != (from_a ? 0 : 1)) {
                    Bytes want = from_server(v6)
                                     .reversed()
                                     .seq(9)
                                     .ack(1101)
                                     .option(opt::nop())
                                     .option(mptcp::mp_prio(false))
                                     .build();
                    Bytes got = dp::prio_frame(x.value, false);
                    if (got != want) FAIL_CHECK("frame differs\n" << describe_frame(got, want));
                    CHECK(checksum_errors(got) == "");
                }
            // An unusable template builds nothing.
            mps_prio_tmpl bad = t;
            bad.len = 10;
            CHECK(dp::prio_frame(bad, false).empty());
        }
    }
}

TEST_CASE("rewrite: set_backup signal_prio sends MP_PRIO from the templates once, and records it",
          "[bpf][rewrite][set_backup]") {
    in_private_netns([] {
        for (Hook h : kCaseHooks) {
            INFO(name_of(h));
            Env env(chain_of({backup_step(true)}));
            auto maps = dp::ActorMaps::of(env.generation());
            Packet ack = from_server(false).option(ts_opt());
            Bytes f = ack.build();
            env.run(h, f);  // B=1 inserted, template kept
            auto k = flow_key_of(ack);
            REQUIRE(maps.prio_sent(k));
            CHECK(maps.signal_prio(0, true) == 0);   // B=1 already signalled
            CHECK(maps.signal_prio(1, false) == 0);  // another step saw nothing
            // lo of the private namespace: AF_PACKET (TC egress) or a live XDP frame (XDP).
            CHECK(maps.signal_prio(0, false) == 1);
            bool from_a = false;
            flow_key_of(ack, &from_a);
            CHECK(maps.prio_sent(k)->sent[from_a ? 0 : 1] == 1);
            CHECK(maps.signal_prio(0, false) == 0);
            CHECK(maps.signal_prio(0, false, 3600ull * 1000000000ull) == 0);
            // Idle filter: a template younger than min_idle is left to the datapath.
            CHECK(maps.signal_prio(0, true, 3600ull * 1000000000ull) == 0);
            CHECK(maps.signal_prio(0, true) == 1);
        }
    });
}

TEST_CASE("rewrite: no_subflows sets the MP_CAPABLE C flag on SYN and SYN/ACK only",
          "[bpf][rewrite][no_subflows]") {
    Env env(chain_of({step(MPS_ACT_NO_SUBFLOWS)}));
    for (bool v6 : {false, true}) {
        for (Hook h : kCaseHooks) {
            INFO((v6 ? "IPv6" : "IPv4") << " via " << name_of(h));
            auto synack = [&](bool nop, uint8_t flags) {
                Packet p = from_server(v6).flags(tcpf::SYN | tcpf::ACK).option(opt::mss(1460));
                if (nop) p.option(opt::nop());
                return p.option(mptcp::capable_synack(0xaabbccddeeff0011ull, flags));
            };
            auto syn = [&](uint8_t flags) {
                return from_server(v6).reversed().flags(tcpf::SYN).option(
                    mptcp::capable_syn(1, flags));
            };
            for (bool nop : {false, true}) {
                INFO("odd offset: " << nop);
                Run r = env.run(h, synack(nop, 0x01).build());
                CHECK(r.retval == retval_of(Verdict::pass, h));
                check_frame(r, synack(nop, 0x21).build());
            }
            check_frame(env.run(h, syn(0x01).build()), syn(0x21).build());
            // Already set, the third ACK, data with MP_CAPABLE, version 0: untouched.
            for (Packet p :
                 {synack(false, 0x21), from_server(v6).reversed().option(mptcp::capable_ack(1, 2)),
                  from_server(v6)
                      .flags(tcpf::SYN | tcpf::ACK)
                      .option(mptcp::capable(mptcp::Capable{0, 0x01, 5, {}, {}, {}}))}) {
                Bytes f = p.build();
                check_frame(env.run(h, f), f);
            }
        }
    }
}

TEST_CASE(
    "rewrite: add_subflow turns a copy of the next packet into a carrier of the stored "
    "ADD_ADDR",
    "[bpf][rewrite][add_subflow]") {
    // XDP blocks, TC ingress re-injects (the client-side deployment).
    dp::ChainSet cs;
    cs.steps = {step(MPS_ACT_BLK_SUBFLOW), step(MPS_ACT_ADD_SUBFLOW, 2), step(MPS_ACT_PASS)};
    cs.policies = {"test"};
    cs.entries = {{Hook::xdp, "", 0}, {Hook::tc_ingress, "", 1}, {Hook::tc_egress, "", 1}};
    Env env(cs);
    auto maps = dp::ActorMaps::of(env.generation());
    const int ingress = env.generation().entry_fd(Hook::tc_ingress);

    struct Case {
        const char* name;
        bool v6, port;
    };
    uint16_t sport = 3000;
    for (const Case& c : {Case{"IPv4", false, false}, Case{"IPv4 with port", false, true},
                          Case{"IPv6", true, false}, Case{"IPv6 with port", true, true}}) {
        INFO(c.name);
        Packet annp = from_server(c.v6);
        if (!(c.v6 && c.port)) annp.option(ts_opt());
        annp.option(announce(c.v6, c.port));
        annp.tcp.sport = sport++;
        env.run(Hook::xdp, annp.build());
        mps_announce_key k{};
        k.flow = flow_key_of(annp);
        k.addr_id = 1;
        REQUIRE(maps.find(k));

        // A later data segment from the server on that subflow (TS + DSS mapping).
        Packet data = annp;
        data.tcp.options.clear();
        data.seq(9000)
            .ack(7100)
            .window(321)
            .option(ts_opt(0x11111111, 0x22222222))
            .option(mptcp::dss(mptcp::Dss{}.ack(77).map(1000, 1, 200)))
            .payload(200);
        data.tcp.flags = tcpf::ACK | tcpf::PSH;
        Bytes dframe = data.build();

        // What the host must receive: a pure ACK right after the segment, with the
        // timestamps (when they fit) and the announcement, HMAC intact.
        Packet want = data;
        want.tcp.payload.clear();
        want.tcp.options.clear();
        want.tcp.flags = tcpf::ACK;
        want.seq(9000 + 200);
        if (!(c.v6 && c.port)) want.option(ts_opt(0x11111111, 0x22222222));
        want.option(announce(c.v6, c.port));
        if (c.port) want.option(opt::nop()).option(opt::nop());
        Bytes wframe = want.build();

        in_private_netns([&] {
            // No request yet: nothing happens.
            Run r = tc_run(ingress, dframe, 0);
            CHECK(r.retval == TC_PASS_);
            CHECK(r.out == dframe);

            REQUIRE(maps.request_add_subflow(k));
            CHECK(maps.find(k)->value.state == MPS_ANN_PENDING);
            // Pass 1: the packet itself goes on untouched; a marked copy is cloned back.
            r = tc_run(ingress, dframe, 0);
            CHECK(r.retval == TC_PASS_);
            CHECK(r.out == dframe);
            CHECK(maps.find(k)->value.state == MPS_ANN_INJECTING);
            // Pass 2 (the copy): becomes the carrier, which is cloned on; the copy is dropped.
            r = tc_run(ingress, dframe, MPS_MARK_COPY | 1);
            CHECK(r.retval == TC_DROP_);
            if (r.out != wframe) FAIL_CHECK("carrier differs\n" << describe_frame(r.out, wframe));
            CHECK(checksum_errors(r.out) == "");
            CHECK(maps.find(k)->value.state == MPS_ANN_RELEASED);
            // Pass 3 (the carrier): passes untouched, with its mark cleared.
            r = tc_run(ingress, wframe, MPS_MARK_CARRIER | 1);
            CHECK(r.retval == TC_PASS_);
            CHECK(r.out == wframe);
        });
        // Released: the announcement's retransmissions are no longer hidden.
        Bytes aframe = annp.build();
        check_frame(env.run(Hook::xdp, aframe), aframe);
    }
}

TEST_CASE("rewrite: add_subflow waits for a packet in the announcement's direction",
          "[bpf][rewrite][add_subflow]") {
    dp::ChainSet cs;
    cs.steps = {step(MPS_ACT_BLK_SUBFLOW), step(MPS_ACT_ADD_SUBFLOW)};
    cs.policies = {"test"};
    cs.entries = {{Hook::xdp, "", 0}, {Hook::tc_ingress, "", 1}};
    Env env(cs);
    auto maps = dp::ActorMaps::of(env.generation());
    Packet annp = from_server(false).option(ts_opt()).option(announce(false, false));
    env.run(Hook::xdp, annp.build());
    mps_announce_key k{};
    k.flow = flow_key_of(annp);
    k.addr_id = 1;
    REQUIRE(maps.request_add_subflow(k));
    in_private_netns([&] {
        Packet back = annp.reversed().option(ts_opt());
        Bytes f = back.build();
        Run r = tc_run(env.generation().entry_fd(Hook::tc_ingress), f, 0);
        CHECK(r.out == f);
        CHECK(maps.find(k)->value.state == MPS_ANN_PENDING);
        // XDP cannot clone: the XDP variant does nothing.
        Run x = env.run(Hook::xdp, back.build());
        CHECK(x.out == f);
        CHECK(maps.find(k)->value.state == MPS_ANN_PENDING);
    });
    CHECK_THROWS(maps.request_add_subflow(mps_announce_key{}));
}

TEST_CASE(
    "rewrite: add_subflow after_bytes re-injects on the first packet past the byte count, "
    "once",
    "[bpf][rewrite][add_subflow]") {
    // The shipped small-flow deployment: XDP counts (record) and hides (blk_subflow), TC
    // ingress re-injects by itself once the connection has carried 1000 bytes.
    mps_step grow = step(MPS_ACT_ADD_SUBFLOW, 3);
    grow.p.add.on_bytes = 1;
    grow.p.add.after_bytes = 1000;
    dp::ChainSet cs;
    cs.steps = {step(MPS_ACT_RECORD, 1), step(MPS_ACT_BLK_SUBFLOW), grow, step(MPS_ACT_PASS)};
    cs.policies = {"test"};
    cs.entries = {{Hook::xdp, "", 0}, {Hook::tc_ingress, "", 2}};
    Env env(cs);
    auto maps = dp::ActorMaps::of(env.generation());
    const int ingress = env.generation().entry_fd(Hook::tc_ingress);

    Packet annp = from_server(false).option(ts_opt()).option(announce(false, false));
    env.run(Hook::xdp, annp.build());
    mps_announce_key k{};
    k.flow = flow_key_of(annp);
    k.addr_id = 1;
    REQUIRE(maps.find(k));
    REQUIRE(env.flow(annp));
    CHECK(env.flow(annp)->hidden_ids == 1u << 1);

    // 400-byte segments from the server on that subflow: the third one makes 1200 bytes.
    auto segment = [&](int i) {
        Packet data = annp;
        data.tcp.options.clear();
        data.seq(uint32_t(9000 + 400 * i))
            .ack(7100)
            .window(321)
            .option(ts_opt(0x11111111 + i, 0x22222222))
            .option(mptcp::dss(mptcp::Dss{}.ack(77).map(1000 + 400 * i, 1 + 400 * i, 400)))
            .payload(400);
        data.tcp.flags = tcpf::ACK | tcpf::PSH;
        return data;
    };
    in_private_netns([&] {
        for (int i = 0; i < 2; i++) {
            INFO("segment " << i + 1 << ": " << 400 * (i + 1) << " bytes, below the threshold");
            Bytes f = segment(i).build();
            check_frame(env.run(Hook::xdp, f), f);
            Run r = tc_run(ingress, f, 0);
            CHECK(r.retval == TC_PASS_);
            CHECK(r.out == f);
            CHECK(maps.find(k)->value.state == MPS_ANN_BLOCKED);
        }
        // 1200 bytes: this packet goes on untouched and a marked copy is cloned back.
        Packet third = segment(2);
        Bytes f = third.build();
        check_frame(env.run(Hook::xdp, f), f);
        Run r = tc_run(ingress, f, 0);
        CHECK(r.retval == TC_PASS_);
        CHECK(r.out == f);
        CHECK(maps.find(k)->value.state == MPS_ANN_INJECTING);
        // The copy becomes the carrier: a pure ACK right after the segment with the
        // timestamps and the announcement, HMAC intact.
        Packet want = third;
        want.tcp.payload.clear();
        want.tcp.options.clear();
        want.tcp.flags = tcpf::ACK;
        want.seq(9000 + 3 * 400);
        want.option(ts_opt(0x11111111 + 2, 0x22222222)).option(announce(false, false));
        const Bytes wframe = want.build();
        r = tc_run(ingress, f, MPS_MARK_COPY | 1);
        CHECK(r.retval == TC_DROP_);
        if (r.out != wframe) FAIL_CHECK("carrier differs\n" << describe_frame(r.out, wframe));
        CHECK(checksum_errors(r.out) == "");
        auto released = maps.find(k);
        REQUIRE(released);
        CHECK(released->value.state == MPS_ANN_RELEASED);
        CHECK(env.flow(annp)->hidden_ids == 0);
        // Later packets carry nothing more.
        Bytes g = segment(3).build();
        check_frame(env.run(Hook::xdp, g), g);
        r = tc_run(ingress, g, 0);
        CHECK(r.retval == TC_PASS_);
        CHECK(r.out == g);
        CHECK(maps.find(k)->value.state == MPS_ANN_RELEASED);
        CHECK(maps.find(k)->value.released_ns == released->value.released_ns);
    });
    // Released: the announcement's retransmissions reach the stack.
    Bytes aframe = annp.build();
    check_frame(env.run(Hook::xdp, aframe), aframe);
}

TEST_CASE(
    "rewrite: redirect ends the chain with a redirect verdict (TC) or leaves the packet "
    "to the stack when the target has no route (XDP)",
    "[bpf][rewrite][redirect]") {
    mps_step rd = step(MPS_ACT_REDIRECT, 1);
    rd.p.redirect.ifindex = 1;  // lo
    Env env(chain_of({rd, step(MPS_ACT_DROP)}));
    for (bool v6 : {false, true}) {
        Bytes f = from_server(v6).option(ts_opt()).payload(10).build();
        // leaving by another interface than the target (a veth in a namespace of its own)
        in_private_netns([&] {
            if (std::system("ip link add mps-rd type veth peer name mps-rd-p") != 0)
                throw std::runtime_error("creating the veth pair failed");
            auto tr = dp::test_run(env.generation().entry_fd(Hook::tc_egress), f, false, 1,
                                   if_nametoindex("mps-rd"));
            CHECK(tr.retval == uint32_t(TC_ACT_REDIRECT));
            CHECK(tr.out == f);
        });
        // XDP: no route to 10.1.0.1 / 2001:db8:1::1 through lo: not redirected, the chain
        // goes on (here to drop, which shows it).
        Run r = env.run(Hook::xdp, f);
        CHECK(r.retval == XDP_DROP_);
        CHECK(r.out == f);
    }
    // At TC egress of the target itself (what a redirected packet meets there): it is
    // already leaving by the target, so it passes instead of looping; the step counts it.
    for (bool v6 : {false, true}) {
        Bytes f = from_server(v6).option(ts_opt()).payload(10).build();
        const auto before = env.steps()[0].matched;
        auto r = dp::test_run(env.generation().entry_fd(Hook::tc_egress), f, false, 1, 1);
        CHECK(r.retval == uint32_t(TC_ACT_OK));
        CHECK(r.out == f);
        CHECK(env.steps()[0].matched == before + 1);
    }
    // No interface (ifindex 0): the chain goes on.
    rd.p.redirect.ifindex = 0;
    Env none(chain_of({rd, step(MPS_ACT_DROP)}));
    CHECK(none.run(Hook::tc_egress, from_server(false).build()).retval == TC_DROP_);
    CHECK(none.run(Hook::xdp, from_server(false).build()).retval == XDP_DROP_);
}

TEST_CASE("rewrite: drop as a guard refuses non-join SYNs to the unique address",
          "[bpf][rewrite][guard]") {
    for (bool v6 : {false, true}) {
        INFO((v6 ? "IPv6" : "IPv4"));
        const char* uniq = v6 ? "2001:db8:2::2/128" : "10.2.0.2/32";
        // dst(unique) -> syn? -> mp_join? (match: pass, miss: drop)
        Env env(chain_of({sel_dst(uniq, 1, END), sel_kinds(MPS_K_SYN, 2, END),
                          sel_kinds(MPS_K_MP_JOIN, END, 3), step(MPS_ACT_DROP)}));
        Packet base = from_server(v6).reversed();  // client -> server
        auto verdict = [&](Packet p) { return env.run(Hook::xdp, p.build()).retval; };
        CHECK(verdict(Packet(base).flags(tcpf::SYN).option(mptcp::capable_syn())) == XDP_DROP_);
        CHECK(verdict(Packet(base).flags(tcpf::SYN)) == XDP_DROP_);
        CHECK(verdict(Packet(base).flags(tcpf::SYN).option(mptcp::join_syn(0x1234, 5, 1))) ==
              XDP_PASS_);
        CHECK(verdict(Packet(base).option(mptcp::dss(mptcp::Dss{}.ack(1))).payload(10)) ==
              XDP_PASS_);
        Packet other =
            v6 ? Packet::v6(C6, 40000, "2001:db8:9::9", 80) : Packet::v4(C4, 40000, "10.9.0.9", 80);
        CHECK(verdict(other.flags(tcpf::SYN).option(mptcp::capable_syn())) == XDP_PASS_);
    }
}

TEST_CASE("rewrite: reject answers a SYN with its reset, back the way it came, and drops the rest",
          "[bpf][rewrite][reject]") {
    Env env(chain_of({step(MPS_ACT_REJECT)}));
    constexpr uint32_t kRedirect = TC_ACT_REDIRECT;
    for (bool v6 : {false, true}) {
        for (size_t data : {size_t(0), size_t(30)}) {  // 30: a SYN with data (TCP Fast Open)
            INFO((v6 ? "IPv6" : "IPv4") << ", SYN payload " << data);
            Packet syn = from_server(v6)
                             .reversed()
                             .seq(0x11223344)
                             .ack(0)
                             .flags(tcpf::SYN)
                             .option(opt::mss(1460))
                             .option(mptcp::join_syn(0x1234, 5, 1));
            if (data) syn.payload(data);
            // Built independently: the SYN's reverse, RST+ACK, seq 0, the SYN (and its data)
            // acknowledged, no options, window 0; the IP header otherwise the SYN's.
            Packet want = syn.reversed()
                              .seq(0)
                              .ack(0x11223345 + uint32_t(data))
                              .flags(tcpf::RST | tcpf::ACK)
                              .window(0);
            for (Hook h : {Hook::tc_egress, Hook::tc_ingress}) {
                INFO(name_of(h));
                Run r = env.run(h, syn.build());
                CHECK(r.retval == kRedirect);
                check_frame(r, want.build());
            }
            // At XDP (refused by the manifest checks): dropped, untouched.
            CHECK(env.run(Hook::xdp, syn.build()).retval == XDP_DROP_);
        }
        // Anything but a SYN, and a SYN whose reply would have to reverse IPv4 options or
        // IPv6 extension headers: dropped as it is.
        Packet base = from_server(v6).reversed();
        Packet with_ext = Packet(base).flags(tcpf::SYN);
        if (v6)
            with_ext.v6h().ext = {dest_opts()};
        else
            with_ext.v4h().options = {1, 1, 1, 1};
        for (Packet p : {Packet(base).flags(tcpf::SYN | tcpf::ACK), Packet(base).payload(100),
                         Packet(base).flags(tcpf::SYN | tcpf::RST), with_ext}) {
            Bytes f = p.build();
            for (Hook h : {Hook::tc_egress, Hook::tc_ingress}) {
                Run r = env.run(h, f);
                CHECK(r.retval == TC_DROP_);
                check_frame(r, f);
            }
        }
    }
    // Every packet counted as a match and a drop (the reset replaces the packet).
    CHECK(env.steps()[0].runs == 2 * (2 * 3 + 4 * 2));
    CHECK(env.steps()[0].drops == env.steps()[0].runs);
}
