// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A property-based fuzz of the datapath: generated frames (Ethernet with 0-2 VLAN tags, IPv4
// with options and fragments, IPv6 with extension headers, TCP option lists mixing every MPTCP
// subtype at right and wrong lengths), some of them then mutated byte-wise, through every
// hook's entry with chains that use every selector and actor. On each frame:
// - the verdict is one the chain allows (pass; drop only with a drop step or a guard; redirect
//   only with a redirect step);
// - a frame whose checksums verify leaves with checksums that verify;
// - a frame the datapath cannot parse (counted malformed or not TCP) leaves byte for byte
//   unchanged, or is dropped by a guard and counted so;
// - the compiled entry and the interpreter give the same verdict and bytes.
// MPS_FUZZ_FRAMES (default 100000) and MPS_FUZZ_SEED (default fixed) make a longer run:
//   MPS_FUZZ_FRAMES=2000000 MPS_FUZZ_SEED=$RANDOM build/tests/bpf/bpf_property_fuzz_tests
#include <catch2/catch.hpp>

#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>

#include <cstdlib>
#include <random>
#include <set>
#include <sstream>

#include "bpf_env.h"

using namespace mpsteer::test;
namespace mt = mptcp;

namespace {

struct Rng {
    std::mt19937_64 g;
    uint64_t below(uint64_t n) { return n ? g() % n : 0; }
    bool coin(double p = 0.5) { return std::uniform_real_distribution<>(0, 1)(g) < p; }
    template <typename T>
    const T& pick(const std::vector<T>& v) {
        return v[below(v.size())];
    }
    Bytes bytes(size_t n) {
        Bytes b(n);
        for (auto& x : b) x = uint8_t(g());
        return b;
    }
};

uint64_t env_number(const char* name, uint64_t fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

// Addresses and ports from small pools, so that selectors match often.
const std::vector<std::string> kV4 = {"10.1.0.1", "10.2.0.1", "10.3.0.1", "192.0.2.9"};
const std::vector<std::string> kV6 = {"fd00::1", "fd00::2", "2001:db8:1::1", "2001:db8:2::2"};
const std::vector<uint16_t> kPorts = {40000, 5201, 80, 443};

// One MPTCP option: well formed for its subtype, or (wrong) a random body of any length.
Bytes mptcp_option(Rng& r) {
    const uint64_t key = r.g(), key2 = r.g();
    switch (r.below(14)) {
    case 0: return mt::capable_syn(uint8_t(r.below(2)), uint8_t(r.g()));
    case 1: return mt::capable_synack(key, uint8_t(r.g()));
    case 2: return mt::capable_ack(key, key2, uint8_t(r.g()));
    case 3: return mt::join_syn(uint32_t(key), uint32_t(key2), uint8_t(r.g()), r.coin());
    case 4: return mt::join_synack(key, uint32_t(key2), uint8_t(r.g()), r.coin());
    case 5: {
        std::array<uint8_t, 20> h{};
        for (auto& x : h) x = uint8_t(r.g());
        return mt::join_ack(h);
    }
    case 6: {
        mt::Dss d;
        if (r.coin()) d.ack(key);
        if (r.coin()) d.map(key2, uint32_t(r.g()), uint16_t(r.below(1500)));
        return mt::dss(d);
    }
    case 7:
        return r.coin()
                   ? mt::add_addr(ip4(r.pick(kV4)), uint8_t(r.g()),
                                  r.coin() ? std::optional<uint16_t>(r.pick(kPorts)) : std::nullopt,
                                  r.coin(0.2), key)
                   : mt::add_addr(ip6(r.pick(kV6)), uint8_t(r.g()),
                                  r.coin() ? std::optional<uint16_t>(r.pick(kPorts)) : std::nullopt,
                                  r.coin(0.2), key);
    case 8: return mt::remove_addr({uint8_t(r.g()), uint8_t(r.g())});
    case 9: return r.coin() ? mt::mp_prio(r.coin()) : mt::mp_prio_v0(r.coin(), uint8_t(r.g()));
    case 10: return mt::mp_fail(key);
    case 11: return mt::fastclose(key);
    case 12: return mt::tcprst(uint8_t(r.g()), uint8_t(r.g()));
    default: {  // any subtype (0-15) at any length, the length byte itself sometimes wrong
        Bytes body = r.bytes(1 + r.below(20));
        body[0] = uint8_t(r.below(16) << 4 | (body[0] & 0x0f));
        return r.coin(0.3) ? opt::raw(30, body, uint8_t(r.below(42))) : opt::raw(30, body);
    }
    }
}

Bytes tcp_option(Rng& r) {
    switch (r.below(9)) {
    case 0: return opt::nop();
    case 1: return opt::mss(uint16_t(r.g()));
    case 2: return opt::wscale(uint8_t(r.below(16)));
    case 3: return opt::sack_perm();
    case 4: return opt::timestamps(uint32_t(r.g()), uint32_t(r.g()));
    case 5: return opt::raw(uint8_t(r.below(256)), r.bytes(r.below(8)));
    default: return mptcp_option(r);
    }
}

Packet generated(Rng& r) {
    const bool v6 = r.coin(0.35);
    Packet p = v6 ? Packet::v6(r.pick(kV6), r.pick(kPorts), r.pick(kV6), r.pick(kPorts))
                  : Packet::v4(r.pick(kV4), r.pick(kPorts), r.pick(kV4), r.pick(kPorts));
    using namespace tcpf;
    p.flags(r.pick(std::vector<uint8_t>{SYN, SYN | ACK, ACK, ACK, ACK | PSH, FIN | ACK, RST,
                                        RST | ACK, uint8_t(r.g())}));
    p.seq(uint32_t(r.g())).ack(uint32_t(r.g())).window(uint16_t(r.g()));
    size_t room = 40;
    for (size_t n = r.below(6); n-- > 0;) {
        Bytes o = tcp_option(r);
        if (o.size() > room) break;
        room -= o.size();
        p.option(o);
    }
    if (r.coin(0.6)) p.payload(r.below(300), uint8_t(r.g()));
    for (size_t n = r.coin(0.15) ? 1 + r.below(2) : 0; n-- > 0;)
        p.vlan(r.coin() ? 0x8100 : 0x88a8, uint16_t(r.below(4096)));
    if (!v6) {
        if (r.coin(0.1)) p.v4h().options = r.coin() ? Bytes{1, 1, 1, 0} : r.bytes(4 * r.below(3));
        if (r.coin(0.05)) p.v4h().frag = uint16_t(r.coin() ? 0x2000 : 0x2000 | r.below(100));
    } else if (r.coin(0.15)) {
        switch (r.below(4)) {
        case 0: p.v6h().ext.push_back(hop_by_hop()); break;
        case 1: p.v6h().ext.push_back(dest_opts()); break;
        case 2: p.v6h().ext.push_back(routing()); break;
        default: p.v6h().ext.push_back(fragment6(uint16_t(r.below(4)), r.coin())); break;
        }
    }
    return p;
}

// Byte-wise damage to a built frame: flips, a cut, a grown tail.
Bytes mutated(Rng& r, Bytes b) {
    switch (r.below(4)) {
    case 0:
    case 1:
        for (size_t n = 1 + r.below(4); n-- > 0;) b[r.below(b.size())] ^= uint8_t(1 + r.below(255));
        break;
    case 2: b.resize(14 + r.below(b.size() - 13)); break;
    default: {
        Bytes tail = r.bytes(1 + r.below(32));
        b.insert(b.end(), tail.begin(), tail.end());
    }
    }
    return b;
}

struct FuzzChain {
    std::string name;
    std::vector<mps_step> steps;
    bool drops = false, guarded = false, redirects = false;
};

mps_step backup_then(uint16_t next) {
    mps_step s = step(MPS_ACT_SET_BACKUP, next);
    s.p.backup.backup = 1;
    return s;
}

// Every selector and every actor, across five chains.
std::vector<FuzzChain> fuzz_chains() {
    std::vector<FuzzChain> v;
    v.push_back(
        {"observers: kinds, src, port, token, sequence, flow_bytes; record, "
         "get_connect, get_subflow",
         {sel_kinds(MPS_K_ANY_MPTCP, 1, 4), step(MPS_ACT_GET_CONNECT, 2),
          step(MPS_ACT_GET_SUBFLOW, 3), sel_src("10.1.0.0/16", 4, 5), step(MPS_ACT_RECORD, 5),
          sel_port(PortDir::either, 5201, 5201, 6, END), sel_token(0x12345678, END, 7),
          sel_seq(MPS_SEQ_SUBFLOW, 0, 1 << 20, 8, 9),
          sel_bytes(MPS_BYTES_SUBFLOW, 0, 1 << 16, END, END),
          sel_seq(MPS_SEQ_DATA, 0, uint64_t(1) << 40, END, END)}});
    v.push_back(
        {"rewriters: subflow, dst; rate_limit, set_backup, no_subflows, blk_subflow, "
         "add_subflow",
         {sel_subflow("10.1.0.1", 40000, "10.2.0.1", 5201, 2, 1), sel_dst("0.0.0.0/0", 2, 7),
          act_rate(125000, 20000, 4096, 3), backup_then(4), step(MPS_ACT_NO_SUBFLOWS, 5),
          step(MPS_ACT_BLK_SUBFLOW, 6), step(MPS_ACT_ADD_SUBFLOW, END), sel_dst("fd00::/8", 8, END),
          step(MPS_ACT_RECORD, END)}});
    mps_step rd = step(MPS_ACT_REDIRECT, END);
    rd.p.redirect.ifindex = 1;  // lo
    v.push_back({"ip_pair to redirect, packet_type to drop, else pass",
                 {sel_ip_pair("10.1.0.1", "10.2.0.1", 3, 1), sel_kinds(MPS_K_ADD_ADDR, 2, 4),
                  step(MPS_ACT_DROP), rd, step(MPS_ACT_PASS)},
                 true,
                 false,
                 true});
    v.push_back(
        {"SYNs to the port rejected, else pass",
         {sel_port(PortDir::dst, 5201, 5201, 1, 2), step(MPS_ACT_REJECT), step(MPS_ACT_PASS)},
         true,
         false,
         true});
    FuzzChain guard{"guard: MP_JOIN passes, anything else to the port drops",
                    {sel_port(PortDir::dst, 5201, 5201, 1, END), sel_kinds(MPS_K_MP_JOIN, END, 2),
                     step(MPS_ACT_DROP)},
                    true,
                    true,
                    false};
    for (auto& s : guard.steps) s.flags |= MPS_STEPF_FAIL_DROP;
    v.push_back(guard);
    return v;
}

enum class Outcome { pass, drop, redirect, other };

Outcome outcome_of(uint32_t retval, Hook h) {
    if (is_xdp(h)) {
        switch (retval) {
        case XDP_PASS: return Outcome::pass;
        case XDP_DROP: return Outcome::drop;
        case XDP_REDIRECT: return Outcome::redirect;
        default: return Outcome::other;
        }
    }
    switch (int(retval)) {
    case TC_ACT_UNSPEC:
    case TC_ACT_OK: return Outcome::pass;
    case TC_ACT_SHOT: return Outcome::drop;
    case TC_ACT_REDIRECT: return Outcome::redirect;
    default: return Outcome::other;
    }
}

// BPF_PROG_TEST_RUN refuses some frames for TC (an skb needs a whole IP header): those are
// skipped for TC, as malformed_test.cpp does.
std::optional<Run> try_run(int fd, const Bytes& frame, bool xdp) {
    try {
        return raw_run(fd, frame, xdp);
    } catch (const std::runtime_error&) {
        if (xdp) throw;
        return std::nullopt;
    }
}

}  // namespace

TEST_CASE("property fuzz: generated and mutated frames through every hook and actor",
          "[bpf][fuzz]") {
    const uint64_t frames = env_number("MPS_FUZZ_FRAMES", 100000);
    const uint64_t seed = env_number("MPS_FUZZ_SEED", 0x6d7073746565ull);
    Rng r{std::mt19937_64(seed)};
    const auto chains = fuzz_chains();
    const std::vector<Hook> hooks = {Hook::xdp, Hook::tc_egress, Hook::tc_ingress};
    uint64_t ran = 0, compared = 0, unparseable = 0, rewritten = 0, checked_sums = 0;
    const uint64_t per_chain = frames / chains.size() + 1;
    for (const auto& c : chains) {
        Env env(chain_of(c.steps));
        const auto& g = env.generation();
        for (uint64_t i = 0; i < per_chain; ++i) {
            const Hook h = hooks[r.below(hooks.size())];
            const Packet p = generated(r);
            Bytes in = p.build();
            const bool damaged = r.coin(0.3);
            if (damaged) in = mutated(r, std::move(in));
            // Built only when a property fails: a hex dump per frame would dominate the run.
            auto where = [&] {
                std::ostringstream w;
                w << c.name << " via " << name_of(h) << ", frame " << i << " (seed " << seed
                  << ")\n"
                  << hexdump(in);
                return w.str();
            };
            const bool sums_ok = locate(in) && verify_checksums(in);
            const Snap before{{}, env.gen()};
            auto run = try_run(g.entry_fd(h), in, is_xdp(h));
            if (!run) continue;
            const Snap after{{}, env.gen()};
            ++ran;
            const Outcome o = outcome_of(run->retval, h);
            if (o == Outcome::other || (o == Outcome::drop && !c.drops) ||
                (o == Outcome::redirect && !c.redirects))
                FAIL("verdict " << run->retval << " not allowed\n" << where());
            if (gen_delta(before, after, MPS_GC_MISSED_TAIL_CALL))
                FAIL("missed tail call\n" << where());
            const uint64_t bad = gen_delta(before, after, MPS_GC_MALFORMED) +
                                 gen_delta(before, after, MPS_GC_NOT_TCP);
            if (bad) {
                ++unparseable;
                if (o == Outcome::drop) {
                    if (!c.guarded || gen_delta(before, after, MPS_GC_UNPARSEABLE_DROPS) != 1)
                        FAIL("unparseable frame dropped without a guard\n" << where());
                } else if (run->out != in) {
                    FAIL("unparseable frame changed\n"
                         << describe_frame(run->out, in) << "\n"
                         << where());
                }
            }
            if (run->out != in) ++rewritten;
            if (sums_ok && o != Outcome::drop) {
                ++checked_sums;
                const std::string errors = checksum_errors(run->out);
                if (!errors.empty())
                    FAIL(errors << "\n" << describe_frame(run->out, in) << "\n" << where());
            }
            // The compiled entry against the interpreter, each from no flow state.
            if (!damaged && g.compiled(h) && r.coin(0.25)) {
                auto fresh = [&](int fd) {
                    const auto key = flow_key_of(p);
                    bpf_map_delete_elem(env.state().flows(), &key);
                    return try_run(fd, in, is_xdp(h));
                };
                auto fast = fresh(g.entry_fd(h));
                auto interp = fresh(g.datapath()->entry_fd(h));
                if (fast.has_value() != interp.has_value())
                    FAIL("only one of compiled and interpreted ran\n" << where());
                if (fast) {
                    ++compared;
                    if (fast->retval != interp->retval || fast->out != interp->out)
                        FAIL("compiled (" << fast->retval << ") and interpreted (" << interp->retval
                                          << ") differ\n"
                                          << describe_frame(fast->out, interp->out) << "\n"
                                          << where());
                }
            }
        }
        env.events();  // drained, so the ring buffer never fills across chains
    }
    WARN("frames run " << ran << ", unparseable " << unparseable << ", rewritten " << rewritten
                       << ", checksums verified " << checked_sums << ", compiled vs interpreter "
                       << compared);
    CHECK(ran >= frames * 9 / 10);
    CHECK(unparseable > 0);
    CHECK(rewritten > 0);
    CHECK(compared > 0);
}
