// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "datapath/chain.h"

#include "net/address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>

namespace mpsteer::datapath {

namespace {
struct ProgName {
    mps_prog prog;
    std::string_view name;
};
constexpr std::array kProgNames{
#define MPS_PROG_NAME(e, value, name, inl, options) ProgName{e, #name},
    MPS_PROGRAMS(MPS_PROG_NAME)
#undef MPS_PROG_NAME
};
// A program's prog-array slot is its value: every one between the interpreter (slot 0) and
// the entry programs (MPS_JMP_ENTRY..., abi_check.cpp places those below MPS_PROG_MAX).
static_assert(std::ranges::all_of(kProgNames,
                                  [](const ProgName& p) {
                                      return p.prog > MPS_PROG_NONE && p.prog < MPS_JMP_ENTRY;
                                  }),
              "a program's slot collides with the interpreter or the entry programs");

std::string pc_str(uint16_t pc) {
    return pc == MPS_PC_END ? "end" : std::to_string(pc);
}

constexpr std::array<std::string_view, MPS_W_MAX> kWordNames = {
    "src0",  "src1",  "src2",  "src3", "dst0",  "dst1",      "dst2",   "dst3",
    "sport", "ports", "kinds", "ip",   "dport", "ports_rev", "kinds'", "ip'"};

std::string params_str(const mps_step& s) {
    std::ostringstream o;
    const auto& p = s.p;
    switch (s.prog) {
    case MPS_SEL_MATCH: {
        const auto& m = p.match;
        if (m.families == MPS_FAMILY_V4) o << "v4 ";
        if (m.families == MPS_FAMILY_V6) o << "v6 ";
        o << std::hex;
        for (unsigned i = 0; i < m.n && i < MPS_MATCH_TESTS; ++i) {
            if (i) o << " & ";
            o << (m.word[i] < MPS_W_MAX ? kWordNames[m.word[i]] : "?");
            if (m.mask[i] != ~0u) o << "&0x" << m.mask[i];
            o << (m.lo[i] == m.hi[i] ? "==0x" : " in 0x") << m.lo[i];
            if (m.lo[i] != m.hi[i]) o << "-0x" << m.hi[i];
        }
        if (m.flags & MPS_MATCHF_EITHER) o << " (either way)";
        break;
    }
    case MPS_SEL_TOKEN: o << "token=0x" << std::hex << p.token.token; break;
    case MPS_SEL_SEQUENCE:
        o << (p.seq.kind == MPS_SEQ_DATA ? "data " : "subflow ") << '[' << p.seq.lo << ','
          << p.seq.hi << ')';
        break;
    case MPS_SEL_FLOW_BYTES:
        o << (p.bytes.scope == MPS_BYTES_CONN ? "connection " : "subflow ") << '[' << p.bytes.lo
          << ',' << p.bytes.hi << ')';
        break;
    case MPS_ACT_RATE_LIMIT:
        o << p.rate.bytes_per_sec << " B/s rtt=" << p.rate.rtt_us
          << "us min_window=" << p.rate.min_window;
        break;
    case MPS_ACT_SET_BACKUP:
        o << "backup=" << int(p.backup.backup) << (p.backup.every_packet ? " every" : " once");
        break;
    case MPS_ACT_ADD_SUBFLOW:
        if (p.add.on_bytes) o << "after=" << p.add.after_bytes;
        break;
    case MPS_ACT_REDIRECT: o << "ifindex=" << p.redirect.ifindex; break;
    default: break;
    }
    return o.str();
}

template <typename T>
void put(std::string& out, const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_str(std::string& out, const std::string& s) {
    put(out, static_cast<uint32_t>(s.size()));
    out += s;
}
}  // namespace

std::string_view prog_name(mps_prog p) {
    for (const auto& e : kProgNames)
        if (e.prog == p) return e.name;
    return "none";
}

std::optional<mps_prog> prog_from_name(std::string_view name) {
    for (const auto& e : kProgNames)
        if (e.name == name) return e.prog;
    return std::nullopt;
}

mps_step make_step(mps_prog prog, uint16_t on_match, uint16_t on_miss, uint16_t policy) {
    mps_step s;
    std::memset(&s, 0, sizeof s);  // padding included: serialize() compares bytes
    s.prog = prog;
    s.on_match = on_match;
    s.on_miss = on_miss;
    s.policy = policy;
    return s;
}

Match::Match(uint8_t family, bool either) {
    p_.families = family == 4   ? MPS_FAMILY_V4
                  : family == 6 ? MPS_FAMILY_V6
                                : MPS_FAMILY_V4 | MPS_FAMILY_V6;
    p_.flags = either ? MPS_MATCHF_EITHER : 0;
}

Match& Match::test(mps_word word, uint32_t mask, uint32_t lo, uint32_t hi) {
    if (p_.n >= MPS_MATCH_TESTS)
        throw std::length_error("a selector of more than " + std::to_string(MPS_MATCH_TESTS) +
                                " tests");
    p_.word[p_.n] = uint8_t(word);
    p_.mask[p_.n] = mask;
    p_.lo[p_.n] = lo;
    p_.hi[p_.n] = hi;
    ++p_.n;
    if ((word & ~MPS_W_SWAP) == MPS_W_KINDS) p_.flags |= MPS_MATCHF_KINDS;
    if ((word & ~MPS_W_SWAP) == MPS_W_IP) p_.flags |= MPS_MATCHF_IP;
    return *this;
}

Match& Match::prefix(mps_word base, const uint32_t addr[4], unsigned bits) {
    const unsigned words = p_.families == MPS_FAMILY_V6 ? 4 : 1;
    for (unsigned i = 0; i < words; ++i) {
        const unsigned b = bits > i * 32 ? std::min(32u, bits - i * 32) : 0;
        if (!b) break;
        const uint32_t mask = htonl(b == 32 ? ~0u : ~0u << (32 - b));
        test(mps_word(base + i), mask, addr[i] & mask, addr[i] & mask);
    }
    return *this;
}

mps_step Match::step(uint16_t on_match, uint16_t on_miss, uint16_t policy) const {
    auto s = make_step(MPS_SEL_MATCH, on_match, on_miss, policy);
    s.p.match = p_;
    if (!p_.n) {  // no test (a /0 prefix): one that always holds, so the family still counts
        s.p.match.n = 1;
        s.p.match.word[0] = MPS_W_SPORT;
        s.p.match.hi[0] = ~0u;
    }
    return s;
}

Match port_match(PortDir dir, uint16_t lo, uint16_t hi) {
    Match m(0, dir == PortDir::either);
    return m.test(dir == PortDir::dst ? MPS_W_DPORT : MPS_W_SPORT, 0xffff, lo, hi);
}

Match kinds_match(uint32_t any_of) {
    return Match().test(MPS_W_KINDS, any_of, 1, ~0u);
}

mps_step cidr4_step(mps_word base, const char* addr, uint8_t prefix, uint16_t on_match) {
    uint32_t a[4] = {};
    inet_pton(AF_INET, addr, &a[0]);
    return Match(4).prefix(base, a, prefix).step(on_match, MPS_PC_END);
}

std::string ChainSet::serialize() const {
    std::string out = "mpsteer-chainset-v1";
    put(out, static_cast<uint32_t>(steps.size()));
    for (const auto& s : steps) put(out, s);
    put(out, static_cast<uint32_t>(entries.size()));
    for (const auto& e : entries) {
        put(out, static_cast<uint8_t>(e.hook));
        put_str(out, e.ifname);
        put(out, e.pc);
    }
    put(out, static_cast<uint32_t>(policies.size()));
    for (const auto& p : policies) put_str(out, p);
    put(out, static_cast<uint32_t>(attachments.size()));
    for (const auto& a : attachments) {
        put_str(out, a.ifname);
        put(out, static_cast<uint8_t>(a.hook));
    }
    put(out, static_cast<uint32_t>(learning_hooks.size()));
    for (Hook h : learning_hooks) put(out, static_cast<uint8_t>(h));
    put(out, static_cast<uint32_t>(step_ifnames.size()));
    for (const auto& [pc, name] : step_ifnames) {
        put(out, pc);
        put_str(out, name);
    }
    return out;
}

std::string ChainSet::describe() const {
    std::ostringstream o;
    for (const auto& e : entries)
        o << "entry " << to_string(e.hook) << (e.ifname.empty() ? "" : " " + e.ifname) << " -> "
          << pc_str(e.pc) << '\n';
    for (Hook h : learning_hooks) o << "learn " << to_string(h) << " (handshakes)\n";
    for (size_t pc = 0; pc < steps.size(); ++pc) {
        const auto& s = steps[pc];
        o << pc << ": " << prog_name(static_cast<mps_prog>(s.prog));
        auto params = params_str(s);
        if (!params.empty()) o << ' ' << params;
        o << " match->" << pc_str(s.on_match);
        if (!MPS_PROG_IS_ACTOR(s.prog)) o << " miss->" << pc_str(s.on_miss);
        if (s.flags & MPS_STEPF_FAIL_DROP) o << " fail=drop";
        if (s.policy < policies.size()) o << " [" << policies[s.policy] << ']';
        o << '\n';
    }
    return o.str();
}

void mark_guarded(std::vector<mps_step>& steps) {
    std::vector<int> state(steps.size(), 0);  // 0 new, 1 on the stack, 2 done
    std::function<bool(uint16_t)> guarded = [&](uint16_t pc) -> bool {
        if (pc >= steps.size() || state[pc] == 1) return false;
        auto& s = steps[pc];
        if (state[pc] == 0) {
            state[pc] = 1;
            bool g = (s.flags & MPS_STEPF_FAIL_DROP) != 0;
            g = guarded(s.on_match) || g;
            if (!MPS_PROG_IS_ACTOR(s.prog)) g = guarded(s.on_miss) || g;
            s.flags =
                static_cast<uint8_t>((s.flags & ~MPS_STEPF_GUARDED) | (g ? MPS_STEPF_GUARDED : 0));
            state[pc] = 2;
        }
        return s.flags & MPS_STEPF_GUARDED;
    };
    for (size_t pc = 0; pc < steps.size(); ++pc) guarded(static_cast<uint16_t>(pc));
}

std::vector<std::string> ChainSet::check() const {
    std::vector<std::string> problems;
    if (steps.size() > MPS_MAX_STEPS)
        problems.push_back("too many steps: " + std::to_string(steps.size()) + " > " +
                           std::to_string(MPS_MAX_STEPS));
    auto valid_pc = [&](uint16_t pc) { return pc == MPS_PC_END || pc < steps.size(); };
    for (size_t pc = 0; pc < steps.size(); ++pc) {
        const auto& s = steps[pc];
        std::string at = "step " + std::to_string(pc) + ": ";
        if (prog_name(static_cast<mps_prog>(s.prog)) == "none")
            problems.push_back(at + "unknown program " + std::to_string(s.prog));
        if (!valid_pc(s.on_match)) problems.push_back(at + "on_match out of range");
        if (!MPS_PROG_IS_ACTOR(s.prog) && !valid_pc(s.on_miss))
            problems.push_back(at + "on_miss out of range");
        if (!policies.empty() && s.policy >= policies.size())
            problems.push_back(at + "policy index out of range");
        if (s.prog == MPS_SEL_MATCH) {
            const auto& m = s.p.match;
            uint8_t reads = 0;
            bool words = true;
            for (unsigned i = 0; i < m.n && i < MPS_MATCH_TESTS; ++i) {
                words &= m.word[i] < MPS_W_MAX;
                const uint8_t w = m.word[i] & ~MPS_W_SWAP;
                reads |= w == MPS_W_KINDS ? MPS_MATCHF_KINDS : w == MPS_W_IP ? MPS_MATCHF_IP : 0;
            }
            if (m.n < 1 || m.n > MPS_MATCH_TESTS || !words ||
                (m.families & ~(MPS_FAMILY_V4 | MPS_FAMILY_V6)) ||
                reads != (m.flags & (MPS_MATCHF_KINDS | MPS_MATCHF_IP)))
                problems.push_back(at + "malformed match (tests, words, families or flags)");
        }
    }
    for (const auto& e : entries)
        if (!valid_pc(e.pc))
            problems.push_back("entry " + std::string(to_string(e.hook)) + ": pc out of range");
    const auto per_iface = std::count_if(entries.begin(), entries.end(),
                                         [](const EntryPoint& e) { return !e.ifname.empty(); });
    if (size_t(per_iface) > kMaxIfaceEntries)
        problems.push_back("too many per-interface entries: " + std::to_string(per_iface) + " > " +
                           std::to_string(kMaxIfaceEntries));
    if (!problems.empty()) return problems;

    // Longest path from each step: steps executed and programs entered (each costs
    // two of the kernel's 33 tail calls: there and back to the interpreter). A cycle is an
    // error.
    struct Depth {
        int steps = 0, actors = 0;
    };
    constexpr int kCycle = 1 << 20;
    std::vector<int> state(steps.size(), 0);  // 0 new, 1 on the stack, 2 done
    std::vector<Depth> memo(steps.size());
    std::function<Depth(uint16_t)> longest = [&](uint16_t pc) -> Depth {
        if (pc == MPS_PC_END) return {};
        if (state[pc] == 1) return {kCycle, 0};
        if (state[pc] == 2) return memo[pc];
        state[pc] = 1;
        const auto& s = steps[pc];
        Depth d = longest(s.on_match);
        if (!MPS_PROG_IS_ACTOR(s.prog)) {
            Depth m = longest(s.on_miss);
            d = {std::max(d.steps, m.steps), std::max(d.actors, m.actors)};
        }
        d.steps = std::min(d.steps, kCycle) + 1;
        if (has_program(static_cast<mps_prog>(s.prog))) d.actors++;
        state[pc] = 2;
        memo[pc] = d;
        return d;
    };
    for (const auto& e : entries) {
        Depth d = longest(e.pc);
        std::string at = "entry " + std::string(to_string(e.hook)) +
                         (e.ifname.empty() ? "" : " " + e.ifname) + ": ";
        if (d.steps >= kCycle)
            problems.push_back(at + "chain has a cycle");
        else if (d.steps > MPS_MAX_CHAIN)
            problems.push_back(at + "a path runs " + std::to_string(d.steps) +
                               " steps, more than " + std::to_string(MPS_MAX_CHAIN));
        if (d.actors > kMaxActorsPerPath)
            problems.push_back(at + "a path enters " + std::to_string(d.actors) +
                               " programs, more than " + std::to_string(kMaxActorsPerPath));
    }
    return problems;
}

std::string to_string(const mps_flow_key& k) {
    return net::endpoint_text(k.family, k.a, k.port_a) + " <-> " +
           net::endpoint_text(k.family, k.b, k.port_b);
}

}  // namespace mpsteer::datapath
