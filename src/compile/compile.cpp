// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Model -> ChainSet. Selector expressions become branches through labels that are bound to
// pcs once the step they name has been emitted (every jump goes forward, so chains cannot loop).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <array>
#include <set>

#include "compile/compile.h"

namespace mpsteer::compile {

using manifest::Action;
using manifest::Policy;
using manifest::Selector;

namespace {

constexpr int kEnd = -1;  // label meaning MPS_PC_END

uint32_t kind_bit(const std::string& name) {
    static const std::map<std::string, uint32_t> bits = {
        {"mp_capable", MPS_K_MP_CAPABLE},
        {"mp_join", MPS_K_MP_JOIN},
        {"dss", MPS_K_DSS},
        {"add_addr", MPS_K_ADD_ADDR},
        {"remove_addr", MPS_K_REMOVE_ADDR},
        {"mp_prio", MPS_K_MP_PRIO},
        {"mp_fail", MPS_K_MP_FAIL},
        {"fastclose", MPS_K_FASTCLOSE},
        {"mp_tcprst", MPS_K_MP_TCPRST},
        {"data_ack", MPS_K_DATA_ACK},
        {"data_fin", MPS_K_DATA_FIN},
        {"any_mptcp", MPS_K_ANY_MPTCP},
        {"plain_tcp", MPS_K_PLAIN_TCP},
        {"syn", MPS_K_SYN},
        {"fin", MPS_K_FIN},
        {"rst", MPS_K_RST},
        {"ack", MPS_K_ACK},
        {"payload", MPS_K_PAYLOAD},
        {"timestamp", MPS_K_TIMESTAMP},
    };
    auto it = bits.find(name);
    if (it == bits.end()) throw Error("unknown packet type '" + name + "'");
    return it->second;
}

// An address as the match tuple's words: network order, as on the wire.
std::array<uint32_t, 4> addr_words(const manifest::IpAddr& a) {
    std::array<uint32_t, 4> w{};
    std::memcpy(w.data(), a.bytes.data(), a.family == 4 ? 4 : 16);
    return w;
}
unsigned full_prefix(const manifest::IpAddr& a) {
    return a.family == 4 ? 32 : 128;
}

struct Builder {
    std::vector<mps_step> steps;
    std::vector<std::array<int, 2>> targets;  // labels of on_match, on_miss
    std::vector<std::string> text;
    std::vector<std::pair<uint16_t, std::string>> ifnames;
    std::vector<int> label_pc;
    uint16_t policy = 0;
    uint8_t flags = 0;

    int label() {
        label_pc.push_back(-2);  // unbound
        return int(label_pc.size() - 1);
    }
    void bind(int l) { label_pc[size_t(l)] = int(steps.size()); }
    void bind_end(int l) { label_pc[size_t(l)] = kEnd; }

    void emit(const mps_step& s, int on_match, int on_miss, std::string t) {
        steps.push_back(s);
        steps.back().flags = flags;
        targets.push_back({on_match, on_miss});
        text.push_back(std::move(t));
    }

    // The selectors the datapath runs inline, as tests on the packet's words (struct
    // mps_p_match); nullopt for the others.
    std::optional<datapath::Match> inline_match(const Selector& s) {
        using datapath::Match;
        switch (s.kind) {
        case Selector::Kind::src:
        case Selector::Kind::dst: {
            const auto a = addr_words(s.addr);
            return Match(s.addr.family)
                .prefix(s.kind == Selector::Kind::src ? MPS_W_SRC : MPS_W_DST, a.data(), s.prefix);
        }
        case Selector::Kind::ip_pair:
        case Selector::Kind::subflow: {
            // Either direction: a is the source and b the destination, or the other way round.
            const auto a = addr_words(s.a), b = addr_words(s.b);
            Match m(s.a.family, true);
            m.prefix(MPS_W_SRC, a.data(), full_prefix(s.a));
            m.prefix(MPS_W_DST, b.data(), full_prefix(s.b));
            if (s.kind == Selector::Kind::subflow) {
                const uint32_t ports = uint32_t(s.port_a) << 16 | s.port_b;
                m.test(MPS_W_PORTS, ~0u, ports, ports);
            }
            return m;
        }
        case Selector::Kind::port:
            return datapath::port_match(s.dir == manifest::PortDir::src ? datapath::PortDir::src
                                        : s.dir == manifest::PortDir::dst
                                            ? datapath::PortDir::dst
                                            : datapath::PortDir::either,
                                        s.port_lo, s.port_hi);
        case Selector::Kind::ttl:  // the IP word's low byte
            return datapath::Match().test(MPS_W_IP, 0xff, s.ip_lo, s.ip_hi);
        case Selector::Kind::dscp:  // the TOS / traffic class's upper six bits
            return datapath::Match().test(MPS_W_IP, 0xfc00, uint32_t(s.ip_lo) << 10,
                                          uint32_t(s.ip_hi) << 10);
        case Selector::Kind::packet_type: {
            uint32_t any_of = 0;
            for (const auto& t : s.packet_types) any_of |= kind_bit(t);
            return datapath::kinds_match(any_of);
        }
        default: return std::nullopt;
        }
    }

    mps_step encode(const Selector& s) {
        if (auto m = inline_match(s)) return m->step(MPS_PC_END, MPS_PC_END, policy);
        mps_step st{};
        auto make = [&](mps_prog p) {
            st = datapath::make_step(p, MPS_PC_END, MPS_PC_END, policy);
        };
        switch (s.kind) {
        case Selector::Kind::token:
            make(MPS_SEL_TOKEN);
            st.p.token.token = s.token;
            break;
        case Selector::Kind::sequence:
            make(MPS_SEL_SEQUENCE);
            st.p.seq.kind = s.seq_kind == manifest::SeqKind::data ? MPS_SEQ_DATA : MPS_SEQ_SUBFLOW;
            st.p.seq.lo = s.lo;
            st.p.seq.hi = s.hi;
            break;
        case Selector::Kind::flow_bytes:
            make(MPS_SEL_FLOW_BYTES);
            st.p.bytes.scope =
                s.scope == manifest::BytesScope::connection ? MPS_BYTES_CONN : MPS_BYTES_SUBFLOW;
            st.p.bytes.lo = s.lo;
            st.p.bytes.hi = s.hi;
            break;
        default: throw Error("not a selector program: " + s.describe());
        }
        return st;
    }

    // Emits `s` so that a match continues at label t and a miss at label f.
    void expr(const Selector& s, int t, int f) {
        switch (s.kind) {
        case Selector::Kind::all:
        case Selector::Kind::any: {
            bool any = s.kind == Selector::Kind::any;
            for (size_t i = 0; i + 1 < s.children.size(); ++i) {
                int next = label();
                // AND: a match goes on to the next child; OR: a miss does.
                expr(s.children[i], any ? t : next, any ? next : f);
                bind(next);
            }
            if (s.children.empty()) throw Error("empty selector group");
            expr(s.children.back(), t, f);
            break;
        }
        case Selector::Kind::not_: expr(s.children.at(0), f, t); break;
        case Selector::Kind::ref: throw Error("unresolved selector_set " + s.ref);
        default: emit(encode(s), t, f, s.describe()); break;
        }
    }

    void action(const Action& a, int next) {
        // The actor's program is the one the registry (MPS_PROGRAMS) names act_<its key>.
        const auto prog = datapath::prog_from_name("act_" + std::string(to_string(a.kind)));
        if (!prog) throw Error("unresolved action_chain " + a.ref);
        mps_step st = datapath::make_step(*prog, MPS_PC_END, MPS_PC_END, policy);
        switch (a.kind) {
        case Action::Kind::rate_limit:
            st.p.rate.bytes_per_sec = a.rate_bytes_per_sec;
            st.p.rate.rtt_us = a.rtt_us;
            st.p.rate.min_window = a.min_window;
            break;
        case Action::Kind::set_backup:
            st.p.backup.backup = a.backup ? 1 : 0;
            st.p.backup.every_packet = a.once ? 0 : 1;
            break;
        case Action::Kind::add_subflow:
            st.p.add.on_bytes = a.after_bytes ? 1 : 0;
            st.p.add.after_bytes = a.after_bytes.value_or(0);
            break;
        case Action::Kind::redirect:
            ifnames.emplace_back(uint16_t(steps.size()), a.interface);  // ifindex: the loader's
            break;
        default: break;
        }
        // The datapath ends the chain after these; say so in the table too.
        emit(st, manifest::ends_chain(a.kind) ? kEnd : next, kEnd, a.describe());
    }

    void policy_steps(const Policy& p, uint16_t index, int next_policy) {
        policy = index;
        flags = p.failure_mode == manifest::FailureMode::drop ? MPS_STEPF_FAIL_DROP : 0;
        int actions = label();
        for (size_t i = 0; i < p.select.size(); ++i) {
            int next = i + 1 < p.select.size() ? label() : actions;
            expr(p.select[i], next, next_policy);
            if (next != actions) bind(next);
        }
        bind(actions);
        int after = p.cont ? next_policy : kEnd;
        for (size_t i = 0; i < p.actions.size(); ++i) {
            int next = i + 1 < p.actions.size() ? label() : after;
            action(p.actions[i], next);
            if (next != after) bind(next);
        }
    }

    uint16_t resolve(int l) const {
        if (l == kEnd) return MPS_PC_END;
        int pc = label_pc.at(size_t(l));
        if (pc == -2) throw Error("internal: unbound label");
        return pc == kEnd ? MPS_PC_END : uint16_t(pc);
    }
};

bool on_hook(const Policy& p, Hook h) {
    return std::binary_search(p.hooks.begin(), p.hooks.end(), h);
}

// The steps of every entry point, labels not yet resolved to pcs.
struct Layout {
    Builder b;
    std::vector<std::pair<datapath::EntryPoint, int>> entries;  // entry, label
    // Per entry (same order): its policies in run order, each with the label of its first step.
    std::vector<std::vector<std::pair<const Policy*, int>>> chains;
    std::set<std::pair<std::string, uint8_t>> attach;
    std::vector<datapath::Hook> learning_hooks;  // attached only to learn handshakes
};

// A rate_limit reads the window scale both SYNs announced, and its hook sees one direction's
// SYN only. Where no chain on the policy's interfaces sees the other direction, the entry is
// attached there too and learns the handshakes without running anything.
void learn_handshakes(const std::vector<const Policy*>& order, Layout& l) {
    std::set<Hook> learning;
    auto attached = [&](const std::string& ifn, Hook h) {
        return l.attach.count({ifn, uint8_t(h)}) || l.attach.count({"", uint8_t(h)});
    };
    for (const Policy* p : order) {
        if (std::none_of(p->actions.begin(), p->actions.end(),
                         [](const Action& a) { return a.kind == Action::Kind::rate_limit; }))
            continue;
        std::vector<std::string> ifnames = p->interfaces;
        if (ifnames.empty()) ifnames.push_back("");
        for (Hook h : p->hooks) {
            const bool egress = h == Hook::tc_egress;
            for (const auto& ifn : ifnames) {
                if (egress ? attached(ifn, Hook::xdp) || attached(ifn, Hook::tc_ingress)
                           : attached(ifn, Hook::tc_egress))
                    continue;
                const Hook other = egress ? Hook::tc_ingress : Hook::tc_egress;
                l.attach.emplace(ifn, uint8_t(other));
                learning.insert(other);
            }
        }
    }
    l.learning_hooks.assign(learning.begin(), learning.end());
}

Layout lay_out(const manifest::Model& model, datapath::ChainSet& cs) {
    std::vector<const Policy*> order;
    for (const auto& p : model.policies) {
        cs.policies.push_back(p.name);
        order.push_back(&p);
    }
    std::sort(cs.policies.begin(), cs.policies.end());
    std::stable_sort(order.begin(), order.end(), [](const Policy* a, const Policy* b) {
        return std::tie(a->priority, a->name) < std::tie(b->priority, b->name);
    });
    auto index_of = [&](const std::string& name) {
        return uint16_t(std::lower_bound(cs.policies.begin(), cs.policies.end(), name) -
                        cs.policies.begin());
    };

    Layout l;
    Builder& b = l.b;
    for (Hook h : kHooks) {
        std::set<std::string> named;
        bool some_unnamed = false;
        for (const Policy* p : order) {
            if (!on_hook(*p, h)) continue;
            named.insert(p->interfaces.begin(), p->interfaces.end());
            some_unnamed |= p->interfaces.empty();
            for (const auto& i : p->interfaces) l.attach.emplace(i, uint8_t(h));
            if (p->interfaces.empty()) l.attach.emplace("", uint8_t(h));
        }
        std::vector<std::string> ifnames;
        if (some_unnamed) ifnames.push_back("");  // every other interface
        ifnames.insert(ifnames.end(), named.begin(), named.end());
        for (const auto& ifn : ifnames) {
            std::vector<const Policy*> chain;
            for (const Policy* p : order) {
                if (!on_hook(*p, h)) continue;
                if (p->interfaces.empty() ||
                    std::binary_search(p->interfaces.begin(), p->interfaces.end(), ifn))
                    chain.push_back(p);
            }
            if (chain.empty()) continue;
            int start = b.label();
            b.bind(start);
            l.entries.push_back({datapath::EntryPoint{h, ifn, 0}, start});
            l.chains.emplace_back();
            int first = start;
            for (size_t i = 0; i < chain.size(); ++i) {
                l.chains.back().emplace_back(chain[i], first);
                int next = i + 1 < chain.size() ? b.label() : kEnd;
                b.policy_steps(*chain[i], index_of(chain[i]->name), next);
                if (next != kEnd) b.bind(next);
                first = next;
            }
        }
    }
    learn_handshakes(order, l);
    return l;
}

void resolve_targets(Builder& b) {
    for (size_t pc = 0; pc < b.steps.size(); ++pc) {
        b.steps[pc].on_match = b.resolve(b.targets[pc][0]);
        b.steps[pc].on_miss =
            MPS_PROG_IS_ACTOR(b.steps[pc].prog) ? MPS_PC_END : b.resolve(b.targets[pc][1]);
    }
}

std::string too_many_steps(size_t n) {
    return "the policies need " + std::to_string(n) + " steps; the datapath holds at most " +
           std::to_string(MPS_MAX_STEPS);
}

}  // namespace

Output compile(const manifest::Model& model) {
    Output out;
    auto& cs = out.chains;
    Layout l = lay_out(model, cs);
    Builder& b = l.b;
    if (b.steps.size() > MPS_MAX_STEPS) throw Error(too_many_steps(b.steps.size()));
    resolve_targets(b);
    for (auto& [e, label] : l.entries) {
        e.pc = b.resolve(label);
        cs.entries.push_back(e);
    }
    for (const auto& [ifn, h] : l.attach) cs.attachments.push_back({ifn, datapath::Hook(h)});
    cs.learning_hooks = l.learning_hooks;
    std::sort(cs.attachments.begin(), cs.attachments.end(), [](const auto& x, const auto& y) {
        return std::tie(x.hook, x.ifname) < std::tie(y.hook, y.ifname);
    });
    cs.steps = std::move(b.steps);
    cs.step_ifnames = std::move(b.ifnames);
    out.step_text = std::move(b.text);
    if (auto problems = cs.check(); !problems.empty()) throw Error(problems.front());
    return out;
}

std::vector<manifest::Diagnostic> check_limits(const manifest::Model& model) {
    std::vector<manifest::Diagnostic> out;
    auto error = [&](const manifest::Position& pos, const char* ptr, std::string msg) {
        out.push_back({manifest::Severity::error, pos, ptr, std::move(msg)});
    };
    datapath::ChainSet cs;
    Layout l = lay_out(model, cs);
    Builder& b = l.b;
    auto policy_of = [&](size_t pc) -> const Policy& {
        const std::string& name = cs.policies.at(b.steps[pc].policy);
        return *std::find_if(model.policies.begin(), model.policies.end(),
                             [&](const Policy& p) { return p.name == name; });
    };
    if (b.steps.size() > MPS_MAX_STEPS) {
        // Each hook, and each interface named on it, has its own copy of its policies' steps.
        const Policy& p = policy_of(MPS_MAX_STEPS);
        error(p.attach_pos, "/spec/attach",
              too_many_steps(b.steps.size()) +
                  " (every hook, and every interface named on it, "
                  "has its own copy of its policies' steps); this policy's steps pass the limit");
        return out;
    }
    // One entry per hook and interface named: the interface lists multiply.
    const Policy* widest = nullptr;
    size_t per_iface = 0;
    for (size_t e = 0; e < l.entries.size(); ++e) {
        if (l.entries[e].first.ifname.empty()) continue;
        ++per_iface;
        for (const auto& [p, label] : l.chains[e])
            if (!widest || p->interfaces.size() > widest->interfaces.size()) widest = p;
    }
    if (per_iface > datapath::kMaxIfaceEntries && widest)
        error(widest->attach_pos, "/spec/attach",
              "the policies need " + std::to_string(per_iface) +
                  " per-interface entries (one per hook and interface named in attach); the "
                  "datapath holds at most " +
                  std::to_string(datapath::kMaxIfaceEntries) +
                  "; this policy names the most interfaces");
    resolve_targets(b);
    // Programs entered on the longest path from each step; jumps only go forward.
    std::vector<int> programs(b.steps.size() + 1, 0);
    auto from = [&](uint16_t pc) { return pc == MPS_PC_END ? 0 : programs[pc]; };
    for (size_t pc = b.steps.size(); pc-- > 0;) {
        const mps_step& s = b.steps[pc];
        int next = from(s.on_match);
        if (!MPS_PROG_IS_ACTOR(s.prog)) next = std::max(next, from(s.on_miss));
        programs[pc] = next + (datapath::has_program(static_cast<mps_prog>(s.prog)) ? 1 : 0);
    }
    std::set<std::string> reported;
    for (size_t e = 0; e < l.entries.size(); ++e) {
        const auto& entry = l.entries[e].first;
        const auto& chain = l.chains[e];
        for (size_t k = chain.size(); k-- > 0;) {
            const auto& [p, label] = chain[k];
            int n = from(b.resolve(label));
            if (n <= datapath::kMaxActorsPerPath) continue;
            if (reported.insert(p->name).second) {
                std::string where =
                    "on hook '" + std::string(datapath::to_string(entry.hook)) + "'" +
                    (entry.ifname.empty() ? "" : " interface '" + entry.ifname + "'");
                error(p->priority_pos, "/spec/priority",
                      where + " a packet may enter " + std::to_string(n) +
                          " step programs from this policy on; at most " +
                          std::to_string(datapath::kMaxActorsPerPath) +
                          " (each costs two of the kernel's 33 tail calls)");
            }
            break;
        }
    }
    return out;
}

}  // namespace mpsteer::compile
