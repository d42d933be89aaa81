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

std::string params_str(const mps_step& s) {
    std::ostringstream o;
    const auto& p = s.p;
    switch (s.prog) {
    case MPS_SEL_SRC:
    case MPS_SEL_DST:
        o << net::address_text(p.cidr.family, p.cidr.addr) << '/' << int(p.cidr.prefix);
        break;
    case MPS_SEL_SUBFLOW:
        o << net::address_text(p.pair.family, p.pair.a) << ':' << p.pair.port_a << " <-> "
          << net::address_text(p.pair.family, p.pair.b) << ':' << p.pair.port_b;
        break;
    case MPS_SEL_IP_PAIR:
        o << net::address_text(p.pair.family, p.pair.a) << " <-> "
          << net::address_text(p.pair.family, p.pair.b);
        break;
    case MPS_SEL_PORT:
        o << (p.port.dir == MPS_DIR_SRC   ? "src "
              : p.port.dir == MPS_DIR_DST ? "dst "
                                          : "")
          << p.port.lo << '-' << p.port.hi;
        break;
    case MPS_SEL_PACKET_TYPE: o << "kinds=0x" << std::hex << p.kinds.any_of; break;
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

mps_step cidr4_step(mps_prog prog, const char* addr, uint8_t prefix, uint16_t on_match) {
    auto s = make_step(prog, on_match, MPS_PC_END);
    s.p.cidr.family = 4;
    s.p.cidr.prefix = prefix;
    s.p.cidr.mask[0] = htonl(prefix ? ~0u << (32 - prefix) : 0);
    inet_pton(AF_INET, addr, &s.p.cidr.addr[0]);
    s.p.cidr.addr[0] &= s.p.cidr.mask[0];
    return s;
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
