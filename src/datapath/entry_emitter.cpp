// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The entry emitter (entry_emitter.h): a hook's chain as BPF instructions, written with the
// assembler of bpf_asm.h. chain_order() picks the steps a packet can reach and orders them so
// every jump goes forward; Emitter writes the program: the live-word check, the IPv4/TCP
// shape checks of parse_packet(), each step, and the cold hand-overs to the entry programs.
//
// Every inline selector is one primitive (struct mps_p_match: tests on words of the packet),
// written twice: here and in the interpreter (bpf/lib/selectors.h); the option walk behind the
// kinds word is written here and in bpf/include/mpsteer/parse.h. tests/bpf/compiled_test.cpp
// holds them together.
#include "datapath/entry_emitter.h"

#include "datapath/bpf_asm.h"

#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

namespace mpsteer::datapath {
namespace {

// mps_pkt_ctx words are built from shifted fields below (the layout is host order).
static_assert(std::endian::native == std::endian::little, "compiled entries assume little endian");

using namespace bpfasm;

// A value as it sits in memory, read as the host's u32 (what a 4-byte load from the packet
// gives): addresses and port pairs compare without byte swaps.
int32_t wire32(uint8_t b0, uint8_t b1, uint8_t b2, uint8_t b3) {
    const uint8_t b[4] = {b0, b1, b2, b3};
    uint32_t v;
    std::memcpy(&v, b, 4);
    return static_cast<int32_t>(v);
}

// ---- the chain as the entry sees it -----------------------------------------------------------

// A step the interpreter (and a compiled entry) runs itself: a cheap selector, pass or drop.
constexpr bool inline_step(uint8_t prog) {
    return prog != MPS_PROG_NONE && prog < MPS_PROG_MAX &&
           !has_program(static_cast<mps_prog>(prog));
}
constexpr bool branches(uint8_t prog) {
    return inline_step(prog) && prog != MPS_ACT_PASS && prog != MPS_ACT_DROP;
}

// What a match test reads on the one shape compiled entries take (IPv4): address words 1-3
// are zero there.
bool word_is_zero(uint8_t w) {
    const uint8_t a = w & ~MPS_W_SWAP;
    return a >= MPS_W_SRC + 1 && a <= MPS_W_SRC + 3;
}
bool holds(const mps_p_match& p, unsigned i, uint32_t v) {
    const uint32_t x = v & p.mask[i];
    return x >= p.lo[i] && x <= p.hi[i];
}
bool reads_kinds(const mps_step& st) {
    return st.prog == MPS_SEL_MATCH && (st.p.match.flags & MPS_MATCHF_KINDS);
}

// A match's outcome on every IPv4 packet, where the tests decide it without the packet.
enum class Outcome { never, always, depends };
// One direction (word ^ swap): never when a test fails on a constant, always when every test
// holds whatever the packet.
Outcome direction(const mps_p_match& p, uint8_t swap) {
    bool depends = false;
    for (unsigned i = 0; i < p.n && i < MPS_MATCH_TESTS; ++i) {
        const uint8_t w = p.word[i] ^ swap;
        if (word_is_zero(w) || !p.mask[i]) {
            if (!holds(p, i, 0)) return Outcome::never;
        } else {
            depends = true;
        }
    }
    return depends ? Outcome::depends : Outcome::always;
}
Outcome outcome(const mps_step& st) {
    const auto& p = st.p.match;
    if (!(p.families & MPS_FAMILY_V4)) return Outcome::never;
    const Outcome fwd = direction(p, 0);
    if (!(p.flags & MPS_MATCHF_EITHER)) return fwd;
    const Outcome rev = direction(p, MPS_W_SWAP);
    if (fwd == Outcome::always || rev == Outcome::always) return Outcome::always;
    if (fwd == Outcome::never && rev == Outcome::never) return Outcome::never;
    return Outcome::depends;
}

// Where a step goes as emitted: a selector that can never match (or always matches) has one
// successor; program steps end a path (their successors are the interpreter's business).
// Distinct pcs, the chain's end left out.
std::vector<uint16_t> successors(const mps_step& st) {
    if (!branches(st.prog)) return {};
    const Outcome o = outcome(st);
    std::vector<uint16_t> out;
    for (uint16_t n : {o == Outcome::never ? MPS_PC_END : st.on_match,
                       o == Outcome::always ? MPS_PC_END : st.on_miss})
        if (n != MPS_PC_END && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    return out;
}

// The pcs a packet can reach from `first` as emitted (code no path reaches is not emitted: the
// verifier rejects it), ordered so that every jump goes forward (the loader rejected cycles;
// lowest pc first among the ready ones). Empty when the chain does not fit.
std::vector<uint16_t> chain_order(const std::vector<mps_step>& steps, uint16_t first) {
    auto next = [&](uint16_t pc) { return successors(steps[pc]); };
    std::map<uint16_t, int> indegree;
    std::set<uint16_t> seen{first};
    std::vector<uint16_t> stack{first}, order;
    while (!stack.empty()) {
        const uint16_t pc = stack.back();
        stack.pop_back();
        if (pc >= steps.size()) return {};
        const uint8_t prog = steps[pc].prog;
        if (!inline_step(prog) && !has_program(static_cast<mps_prog>(prog))) return {};
        indegree.try_emplace(pc, 0);
        for (uint16_t n : next(pc)) {
            ++indegree[n];
            if (seen.insert(n).second) stack.push_back(n);
        }
    }
    if (seen.size() > kCompiledMaxSteps) return {};
    std::set<uint16_t> ready;
    for (auto [pc, d] : indegree)
        if (d == 0) ready.insert(pc);
    while (!ready.empty()) {
        const uint16_t pc = *ready.begin();
        ready.erase(ready.begin());
        order.push_back(pc);
        for (uint16_t n : next(pc))
            if (--indegree[n] == 0) ready.insert(n);
    }
    if (order.size() != seen.size()) return {};
    return order;
}

// ---- the program ----------------------------------------------------------------------------

// Frame offsets of the one shape taken: Ethernet, IPv4 without options, TCP.
constexpr int16_t kIp = ETH_HLEN, kSaddr = kIp + 12, kDaddr = kIp + 16, kTotLen = kIp + 2;
constexpr int16_t kTcp = kIp + 20, kPorts = kTcp, kDoffFlags = kTcp + 12, kOpts = kTcp + 20;
constexpr int32_t kTcpOptMax = 40;  // option bytes, >= 1 each: bounds the walk

// Registers that live across helper calls: the context, the packet's start and end; R9 holds
// the kinds while the options are walked and a context word before a hand-over.
constexpr Reg kCtx = R6, kData = R7, kEnd = R8, kAcc = R9;
// Stack: halfwords the verifier cannot track (fp-6, fp-2), the kinds (fp-12, a 4-byte slot half,
// which it does not track either: paths that differ only in the kinds meet in one state),
// whether the options were walked (fp-24) and map keys (fp-32).
constexpr int16_t kOpaque = -6, kKinds = -12, kScanned = -24, kKey = -32;

class Emitter {
public:
    Emitter(const std::vector<mps_step>& steps, std::vector<uint16_t> order, Hook hook,
            uint32_t live, const EntryMaps& maps)
        : steps_(steps),
          order_(std::move(order)),
          hook_(hook),
          xdp_(hook == Hook::xdp),
          live_(live),
          slot_(live & 1),
          maps_(maps) {}

    std::vector<bpf_insn> emit() {
        plan_scans();
        step_labels_.clear();
        for (size_t i = 0; i < order_.size(); ++i) step_labels_.push_back(a_.label());
        end_ = a_.label();
        not_live_ = a_.label();
        not_ours_ = a_.label();
        Label live = a_.label();

        a_.alu64(BPF_MOV, kCtx, R1);
        // Not our generation (yet, or any more): the entry program runs whichever is.
        a_.ld_map_value(R1, maps_.slots, offsetof(mps_slots, active));
        a_.load(BPF_W, R2, R1, 0);
        a_.jmp32(BPF_JNE, R2, static_cast<int32_t>(live_), not_live_);
        a_.bind(live);
        parse();
        if (mixed_) {  // some step is reached both with and without the walk: a flag says
            a_.store(BPF_DW, FP, kKinds - 4, 0);
            a_.store(BPF_W, FP, kScanned, 0);
        }
        for (size_t i = 0; i < order_.size(); ++i) {
            a_.bind(step_labels_[i]);
            step(i);
        }
        if (a_.used(end_) || a_.falls_through()) {
            a_.bind(end_);
            count_gen(MPS_GC_PACKETS);
            a_.ret(pass());
        }

        // Cold paths (the verifier rejects code no path reaches).
        a_.bind(not_live_);  // R1 still points at mps_slots.active
        // Under test (the agent's pre-flight, before any link holds this program) the
        // staged generation runs here, and the preflight entry takes what this does not.
        a_.load(BPF_W, R2, R1, offsetof(mps_slots, testing) - offsetof(mps_slots, active));
        a_.jmp32(BPF_JEQ, R2, static_cast<int32_t>(live_), live);
        tail_call(MPS_JMP_ENTRY + static_cast<int>(hook_));
        a_.ret(pass());

        a_.bind(not_ours_);  // not the shape taken: the entry program (or its preflight twin)
        Label preflight = a_.label();
        a_.ld_map_value(R1, maps_.slots, offsetof(mps_slots, active));
        a_.load(BPF_W, R2, R1, 0);
        a_.jmp32(BPF_JNE, R2, static_cast<int32_t>(live_), preflight);
        tail_call(MPS_JMP_ENTRY + static_cast<int>(hook_));
        a_.ret(pass());
        a_.bind(preflight);
        tail_call(MPS_JMP_PREFLIGHT + static_cast<int>(hook_));
        a_.ret(pass());

        return a_.finish();
    }

private:
    int32_t pass() const { return xdp_ ? XDP_PASS : TC_ACT_UNSPEC; }
    int32_t drop() const { return xdp_ ? XDP_DROP : TC_ACT_SHOT; }
    // A successor's label (none for a step that successors() left out: never jumped to).
    Label target(uint16_t pc) const {
        if (pc == MPS_PC_END) return end_;
        const size_t i = index_of(pc);
        return i < order_.size() ? step_labels_[i] : Label{};
    }
    // The label of the code that follows step i's.
    Label next(size_t i) const { return i + 1 < order_.size() ? step_labels_[i + 1] : end_; }

    size_t index_of(uint16_t pc) const {
        return std::find(order_.begin(), order_.end(), pc) - order_.begin();
    }

    // Whether each step is reached with the options walked: 1 without, 2 with, 3 either.
    void plan_scans() {
        reach_.assign(order_.size(), 0);
        reach_[0] = 1;
        for (size_t i = 0; i < order_.size(); ++i) {
            const auto& st = steps_[order_[i]];
            const bool scans = reads_kinds(st) && outcome(st) == Outcome::depends;
            const uint8_t out = scans ? 2 : reach_[i];
            for (uint16_t n : successors(st)) reach_[index_of(n)] |= out;
        }
        mixed_ = std::find(reach_.begin(), reach_.end(), 3) != reach_.end();
    }

    // The checks of parse_packet() for exactly one shape: Ethernet, IPv4 without options,
    // TCP, not a fragment, not a SYN, FIN or RST, every length consistent. Anything else:
    // not_ours_.
    void parse() {
        if (xdp_) {
            a_.load(BPF_W, kData, kCtx, offsetof(xdp_md, data));
            a_.load(BPF_W, kEnd, kCtx, offsetof(xdp_md, data_end));
        } else {
            a_.load(BPF_W, kData, kCtx, offsetof(__sk_buff, data));
            a_.load(BPF_W, kEnd, kCtx, offsetof(__sk_buff, data_end));
        }
        a_.alu64(BPF_MOV, R1, kData);
        a_.alu64(BPF_ADD, R1, kOpts);
        a_.jmp64(BPF_JGT, R1, kEnd, not_ours_);
        // Ethernet type, IP version and ihl (TOS masked); the fragment bits and the protocol
        // (TTL masked): two words instead of six fields.
        a_.load(BPF_W, R1, kData, 12);
        a_.alu32(BPF_AND, R1, wire32(0xff, 0xff, 0xff, 0));
        a_.jmp32(BPF_JNE, R1, wire32(ETH_P_IP >> 8, ETH_P_IP & 0xff, 0x45, 0), not_ours_);
        a_.load(BPF_W, R1, kData, kIp + 6);
        a_.alu32(BPF_AND, R1, wire32(0x3f, 0xff, 0, 0xff));
        a_.jmp32(BPF_JNE, R1, wire32(0, 0, 0, IPPROTO_TCP), not_ours_);
        // The IP length fits the frame.
        a_.load(BPF_H, R1, kData, kTotLen);
        a_.be16(R1);
        if (xdp_) {  // the frame is data..data_end
            a_.alu64(BPF_MOV, R3, kData);
            a_.alu64(BPF_ADD, R3, R1);
            a_.alu64(BPF_ADD, R3, ETH_HLEN);
            a_.jmp64(BPF_JGT, R3, kEnd, not_ours_);
        } else {
            a_.load(BPF_W, R2, kCtx, offsetof(__sk_buff, len));
            a_.alu64(BPF_MOV, R3, R1);
            a_.alu64(BPF_ADD, R3, ETH_HLEN);
            a_.jmp64(BPF_JGT, R3, R2, not_ours_);
        }
        // Not a SYN, FIN or RST (the entry program learns the flow's start and end from
        // them); 20 <= TCP header length <= IP length - 20 (so the IP length >= 40).
        a_.load(BPF_H, R2, kData, kDoffFlags);
        a_.be16(R2);
        a_.jmp32(BPF_JSET, R2, 0x07, not_ours_);
        a_.alu32(BPF_RSH, R2, 10);
        a_.alu32(BPF_AND, R2, 0x3c);
        a_.jmp32(BPF_JLT, R2, 20, not_ours_);
        if (!xdp_) {  // an skb's linear part may end before its length: the header must be in it
            a_.alu64(BPF_MOV, R3, kData);
            a_.alu64(BPF_ADD, R3, R2);
            a_.alu64(BPF_ADD, R3, kTcp);
            a_.jmp64(BPF_JGT, R3, kEnd, not_ours_);
        }
        a_.alu32(BPF_ADD, R2, 20);
        a_.jmp32(BPF_JGT, R2, R1, not_ours_);
    }

    void step(size_t i) {
        const auto& st = steps_[order_[i]];
        const Label m = branches(st.prog) ? target(st.on_match) : Label{};
        const Label n = branches(st.prog) ? target(st.on_miss) : Label{};
        switch (st.prog) {
        case MPS_SEL_MATCH: match(i, st, m, n); return;
        case MPS_ACT_PASS:
        case MPS_ACT_DROP: {
            const bool dropped = st.prog == MPS_ACT_DROP;
            count_gen(MPS_GC_PACKETS);
            std::vector<int16_t> fields{kRuns, kMatched};
            if (dropped) fields.push_back(kDrops);
            count_step(order_[i], fields);
            a_.ret(dropped ? drop() : pass());
            return;
        }
        default: hand_over(i, st); return;
        }
    }

    // The inline selector: each direction's tests, a failed one going on to the other
    // direction (either way) or to the miss; the packet's words loaded as the interpreter's
    // match tuple has them (load_match_tuple()).
    void match(size_t i, const mps_step& st, Label m, Label n) {
        const auto& p = st.p.match;
        const Outcome o = outcome(st);
        if (o != Outcome::depends) {
            a_.ja(o == Outcome::always ? m : n, next(i));
            return;
        }
        if (reads_kinds(st)) {
            if (reach_[i] == 1) {
                scan();
            } else if (reach_[i] == 3) {
                Label done = a_.label();
                a_.load(BPF_W, R1, FP, kScanned);
                a_.jmp32(BPF_JNE, R1, 0, done);
                scan();
                a_.bind(done);
            }
        }
        const bool either = p.flags & MPS_MATCHF_EITHER;
        const Outcome fwd = direction(p, 0);
        const Outcome rev = either ? direction(p, MPS_W_SWAP) : Outcome::never;
        if (fwd == Outcome::depends) {
            Label failed = rev == Outcome::never ? n : a_.label();
            tests(p, 0, failed);
            a_.ja(m, rev == Outcome::never ? next(i) : Label{});
            if (rev == Outcome::never) return;
            a_.bind(failed);
        }
        tests(p, MPS_W_SWAP, n);
        a_.ja(m, next(i));
    }

    // Falls through when every test holds on the words read as word ^ swap, else jumps to
    // `failed`. A test on a constant word was decided by direction().
    void tests(const mps_p_match& p, uint8_t swap, Label failed) {
        for (unsigned t = 0; t < p.n && t < MPS_MATCH_TESTS; ++t) {
            const uint8_t w = p.word[t] ^ swap;
            if (word_is_zero(w) || !p.mask[t]) continue;
            load_word(R1, w);
            if (p.mask[t] != ~0u) a_.alu32(BPF_AND, R1, static_cast<int32_t>(p.mask[t]));
            if (p.lo[t] == p.hi[t]) {
                a_.jmp32(BPF_JNE, R1, static_cast<int32_t>(p.lo[t]), failed);
                continue;
            }
            if (p.lo[t]) a_.jmp32(BPF_JLT, R1, static_cast<int32_t>(p.lo[t]), failed);
            if (p.hi[t] != ~0u) a_.jmp32(BPF_JGT, R1, static_cast<int32_t>(p.hi[t]), failed);
        }
    }

    // A word of the match tuple into r (R2 scratch).
    void load_word(Reg r, uint8_t w) {
        switch (w) {
        case MPS_W_SRC: a_.load(BPF_W, r, kData, kSaddr); return;
        case MPS_W_DST: a_.load(BPF_W, r, kData, kDaddr); return;
        case MPS_W_SPORT:
        case MPS_W_DPORT:
            a_.load(BPF_H, r, kData, w == MPS_W_SPORT ? kPorts : kPorts + 2);
            a_.be16(r);
            return;
        case MPS_W_PORTS:
        case MPS_W_PORTS_REV:
            a_.load(BPF_W, r, kData, kPorts);
            a_.be32(r);
            if (w == MPS_W_PORTS_REV) {
                a_.alu64(BPF_MOV, R2, r);
                a_.alu32(BPF_LSH, r, 16);
                a_.alu32(BPF_RSH, R2, 16);
                a_.alu32(BPF_OR, r, R2);
            }
            return;
        case MPS_W_KINDS:
        case MPS_W_KINDS ^ MPS_W_SWAP: a_.load(BPF_W, r, FP, kKinds); return;
        default:  // MPS_W_IP and its swap: TOS << 8 | TTL
            a_.load(BPF_B, r, kData, kIp + 1);
            a_.alu32(BPF_LSH, r, 8);
            a_.load(BPF_B, R2, kData, kIp + 8);
            a_.alu32(BPF_OR, r, R2);
            return;
        }
    }

    // The option walk of scan_kinds() (bpf/include/mpsteer/parse.h): the kinds to fp-12. A
    // malformed walk goes to the entry program (not_ours_), which decides what such a packet
    // gets (passed, or dropped under a guard). parse() proved 20 <= header length <= TCP length.
    void scan() {
        const int32_t ts_word = wire32(1, 1, 8, 10);  // NOP NOP TS(10): Linux's usual start
        // The flags: only ACK (0x10) can be set here; SYN, FIN and RST went to the entry
        // program, which learns from them (parse()).
        a_.load(BPF_B, kAcc, kData, kDoffFlags + 1);
        a_.alu32(BPF_AND, kAcc, 0x10);
        a_.alu32(BPF_LSH, kAcc, 12);            // MPS_K_ACK
        a_.load(BPF_B, R3, kData, kDoffFlags);  // R3: header length
        a_.alu32(BPF_RSH, R3, 2);
        a_.alu32(BPF_AND, R3, 0x3c);
        a_.load(BPF_H, R4, kData, kTotLen);  // R4: TCP length
        a_.be16(R4);
        a_.alu32(BPF_SUB, R4, 20);
        Label no_payload = a_.label(), walk = a_.label(), done = a_.label();
        a_.jmp32(BPF_JLE, R4, R3, no_payload);
        a_.alu32(BPF_OR, kAcc, MPS_K_PAYLOAD);
        a_.bind(no_payload);
        a_.alu64(BPF_MOV, R2, 20);  // R2: offset in the header
        a_.jmp32(BPF_JLT, R3, 32, walk);
        a_.alu64(BPF_MOV, R1, kData);
        a_.alu64(BPF_ADD, R1, kOpts + 4);
        a_.jmp64(BPF_JGT, R1, kEnd, walk);
        a_.load(BPF_W, R1, kData, kOpts);
        a_.jmp32(BPF_JNE, R1, ts_word, walk);
        a_.alu32(BPF_OR, kAcc, MPS_K_TIMESTAMP);
        a_.alu64(BPF_MOV, R2, 32);
        // The DSS's first 4 bytes are in the frame: the shortcut, out of line below (its ways
        // back into the walk then meet states the verifier has already seen there).
        Label dss_shortcut = a_.label();
        a_.alu64(BPF_MOV, R1, kData);
        a_.alu64(BPF_ADD, R1, kOpts + 16);
        a_.jmp64(BPF_JLE, R1, kEnd, dss_shortcut);
        a_.bind(walk);
        a_.alu32(BPF_ADD, R2, kTcp);  // offsets from the frame's start from here on
        a_.alu32(BPF_ADD, R3, kTcp);
        // What the verifier knows of these differs by the way here (payload or not, timestamp
        // or not): forgotten, every way meets in one state and the walk is verified once.
        opaque(R2, kOpaque);
        opaque(R3, kOpaque + 4);
        a_.store(BPF_W, FP, kKinds, kAcc);
        a_.load(BPF_W, kAcc, FP, kKinds);
        // Unrolled: one copy per option, at most kTcpOptMax (option bytes, >= 1 each). A loop
        // is verified per turn and pruned only where the verifier chose to keep a state: 6.1's
        // keeps one every 20 jumps in a loop and gave up on this walk after 1M instructions;
        // unrolled, the ways through one copy meet at the next copy's start and are pruned.
        for (int32_t copy = 0; copy < kTcpOptMax; ++copy) {
            Label next_opt = a_.label(), option = a_.label(), mptcp = a_.label();
            Label subtype = a_.label(), mpc = a_.label();
            a_.jmp32(BPF_JGE, R2, R3, done);
            // R5: the option, at an offset the verifier does not track (see opaque_u16()): the
            // ways through one copy then meet again at the next.
            a_.alu64(BPF_MOV, R5, R2);
            opaque(R5, kOpaque);
            a_.alu32(BPF_AND, R5, 0x3ff);
            a_.alu64(BPF_ADD, R5, kData);
            option_readable(R0, 1);
            a_.load(BPF_B, R0, R5, 0);  // R0: kind
            a_.jmp32(BPF_JEQ, R0, 0, done);
            a_.jmp32(BPF_JNE, R0, 1, option);
            a_.alu32(BPF_ADD, R2, 1);  // NOP
            a_.ja(next_opt);
            a_.bind(option);
            option_readable(R1, 2);
            a_.load(BPF_B, R1, R5, 1);  // R1: length
            a_.jmp32(BPF_JLT, R1, 2, not_ours_);
            a_.alu32(BPF_ADD, R2, R1);
            a_.jmp32(BPF_JGT, R2, R3, not_ours_);
            a_.jmp32(BPF_JEQ, R0, 30 /* MPTCP */, mptcp);
            a_.jmp32(BPF_JNE, R0, 8 /* timestamp */, next_opt);
            a_.jmp32(BPF_JNE, R1, 10, next_opt);
            a_.alu32(BPF_OR, kAcc, MPS_K_TIMESTAMP);
            a_.ja(next_opt);
            a_.bind(mptcp);
            a_.jmp32(BPF_JLT, R1, 3, not_ours_);
            option_readable(R0, 3);
            a_.load(BPF_B, R0, R5, 2);  // R0: subtype
            a_.alu32(BPF_RSH, R0, 4);
            // MP_CAPABLE and MP_JOIN count only at the lengths the kernel parses (mptcp_lens_of()
            // in parse.h; never a SYN here): MP_CAPABLE 20, or 22 / 24 with data; MP_JOIN 24.
            Label dss = a_.label(), mpc_data = a_.label();
            a_.jmp32(BPF_JEQ, R0, 2 /* DSS */, dss);
            a_.jmp32(BPF_JGT, R0, 1, subtype);
            a_.jmp32(BPF_JEQ, R0, 0, mpc);
            a_.jmp32(BPF_JNE, R1, 24, next_opt);  // MP_JOIN third ACK
            a_.ja(subtype);
            a_.bind(mpc);
            a_.alu64(BPF_MOV, R5, kAcc);
            a_.alu32(BPF_AND, R5, MPS_K_PAYLOAD);
            a_.jmp32(BPF_JNE, R5, 0, mpc_data);
            a_.jmp32(BPF_JNE, R1, 20, next_opt);
            a_.ja(subtype);
            a_.bind(mpc_data);
            a_.jmp32(BPF_JEQ, R1, 22, subtype);
            a_.jmp32(BPF_JNE, R1, 24, next_opt);
            a_.ja(subtype);
            a_.bind(dss);
            a_.jmp32(BPF_JLT, R1, 4, not_ours_);
            option_readable(R1, 4);
            a_.load(BPF_B, R1, R5, 3);
            dss_flag_kinds();
            a_.bind(subtype);
            a_.alu64(BPF_MOV, R1, 1);
            a_.alu32(BPF_LSH, R1, R0);
            a_.alu32(BPF_AND, R1, 0x1ff);
            a_.alu32(BPF_OR, kAcc, R1);
            a_.alu32(BPF_OR, kAcc, MPS_K_ANY_MPTCP);
            a_.bind(next_opt);
        }
        a_.bind(done);
        // MPS_K_PLAIN_TCP when no MPTCP option: arithmetic, like scan_kinds().
        a_.alu64(BPF_MOV, R1, kAcc);
        a_.alu32(BPF_RSH, R1, 11);
        a_.alu32(BPF_AND, R1, 1);
        a_.alu32(BPF_LSH, R1, 12);
        a_.alu32(BPF_XOR, R1, MPS_K_PLAIN_TCP);
        a_.alu32(BPF_OR, kAcc, R1);
        a_.store(BPF_W, FP, kKinds, kAcc);
        if (mixed_) a_.store(BPF_W, FP, kScanned, MPS_CTXF_SCANNED);
        Label after = a_.label();
        a_.ja(after);
        a_.bind(dss_shortcut);
        dss_last(walk, done);
        a_.bind(after);
    }

    // After NOP NOP TS, with the option's first 4 bytes in the frame: a DSS that ends the
    // header (Linux's data segment) gives the walk's kinds without the walk, whose per-option
    // stack round trips cost more than its instructions; anything else goes back to `walk`.
    // R3: the header length, compared only against the option's length, so that every way
    // back to the walk keeps what the verifier knew of it there.
    void dss_last(Label walk, Label done) {
        a_.load(BPF_B, R1, kData, kOpts + 12);
        a_.jmp32(BPF_JNE, R1, 30 /* MPTCP */, walk);
        a_.load(BPF_B, R1, kData, kOpts + 14);
        a_.alu32(BPF_RSH, R1, 4);
        a_.jmp32(BPF_JNE, R1, 2 /* DSS */, walk);
        a_.load(BPF_B, R1, kData, kOpts + 13);  // its length: at least 4, up to the header's end
        a_.jmp32(BPF_JLT, R1, 4, walk);
        a_.alu32(BPF_ADD, R1, 32);
        a_.jmp32(BPF_JNE, R1, R3, walk);
        a_.load(BPF_B, R1, kData, kOpts + 15);
        dss_flag_kinds();
        a_.alu32(BPF_OR, kAcc, MPS_K_DSS | MPS_K_ANY_MPTCP);
        a_.ja(done);
    }

    // The DSS flags in R1 into the kinds: A (data ACK) 0x01, F (DATA_FIN) 0x10 (clobbers R1, R5).
    void dss_flag_kinds() {
        a_.alu64(BPF_MOV, R5, R1);
        a_.alu32(BPF_AND, R5, 0x01);
        a_.alu32(BPF_LSH, R5, 9);  // MPS_K_DATA_ACK
        a_.alu32(BPF_OR, kAcc, R5);
        a_.alu32(BPF_RSH, R1, 4);
        a_.alu32(BPF_AND, R1, 0x01);
        a_.alu32(BPF_LSH, R1, 10);  // MPS_K_DATA_FIN
        a_.alu32(BPF_OR, kAcc, R1);
    }

    // The option at R5 has n bytes inside the frame, else the entry program takes the packet
    // (`scratch` is clobbered).
    void option_readable(Reg scratch, int32_t n) {
        a_.alu64(BPF_MOV, scratch, R5);
        a_.alu64(BPF_ADD, scratch, n);
        a_.jmp64(BPF_JGT, scratch, kEnd, not_ours_);
    }

    // r (< 64k) through a halfword of the stack the verifier does not track (not 8-aligned):
    // what comes back is a value it knows nothing of (opaque_u16() in parse.h).
    void opaque(Reg r, int16_t at) {
        a_.store(BPF_H, FP, at, r);
        a_.load(BPF_H, r, FP, at);
    }

    // A program step: the context the interpreter would hand over, then its program. What
    // follows runs only when that fails (counted, answered with the step's failure mode).
    void hand_over(size_t i, const mps_step& st) {
        const uint16_t pc = order_[i];
        // Words of struct mps_pkt_ctx: {pc, hops 1, flags}, {family 4, hook, l3_off},
        // {l4_off, l4_len}, kinds, scratch 0. The TCP length before the helpers clobber R1-R5.
        a_.load(BPF_H, kAcc, kData, kTotLen);
        a_.be16(kAcc);
        a_.alu32(BPF_SUB, kAcc, 20);
        a_.alu32(BPF_LSH, kAcc, 16);
        a_.alu32(BPF_OR, kAcc, kTcp);
        count_gen(MPS_GC_PACKETS);
        Reg base = kCtx;
        int16_t at = offsetof(__sk_buff, cb);
        if (xdp_) {  // the per-CPU context (bpf/lib/chain_maps.h: xdp_pkt_ctx)
            lookup(maps_.xdp_ctx, 0);
            Label found = a_.label();
            a_.jmp64(BPF_JNE, R0, 0, found);
            a_.ret(pass());
            a_.bind(found);
            base = R0;
            at = 0;
        }
        const int32_t flags =
            (slot_ ? MPS_CTXF_SLOT1 : 0) | (reach_[i] == 2 ? MPS_CTXF_SCANNED : 0);
        a_.alu64(BPF_MOV, R1, pc | 1 << 16 | flags << 24);
        if (reach_[i] == 3) {
            a_.load(BPF_W, R4, FP, kScanned);
            a_.alu32(BPF_LSH, R4, 24);
            a_.alu32(BPF_OR, R1, R4);
        }
        a_.store(BPF_W, base, at, R1);
        a_.alu64(BPF_MOV, R1, 4 | static_cast<int32_t>(hook_) << 8 | ETH_HLEN << 16);
        a_.store(BPF_W, base, at + 4, R1);
        a_.store(BPF_W, base, at + 8, kAcc);
        if (reach_[i] == 1)
            a_.alu64(BPF_MOV, R1, 0);
        else
            a_.load(BPF_W, R1, FP, kKinds);
        a_.store(BPF_W, base, at + 12, R1);
        a_.alu64(BPF_MOV, R1, 0);
        a_.store(BPF_W, base, at + 16, R1);
        tail_call(st.prog);
        count_gen(MPS_GC_MISSED_TAIL_CALL);
        count_step(pc, {kMissed});
        a_.ret((st.flags & MPS_STEPF_FAIL_DROP) ? drop() : pass());
    }

    // A constant key: the verifier makes it a direct jump.
    void tail_call(int key) {
        a_.alu64(BPF_MOV, R1, kCtx);
        a_.ld_map(R2, maps_.jmp);
        a_.alu64(BPF_MOV, R3, key);
        a_.call(BPF_FUNC_tail_call);
    }

    // R0 = the array element `key` of `map`, or 0 (clobbers R0-R5).
    void lookup(int map, uint32_t key) {
        a_.store(BPF_W, FP, kKey, static_cast<int32_t>(key));
        a_.ld_map(R1, map);
        a_.alu64(BPF_MOV, R2, FP);
        a_.alu64(BPF_ADD, R2, kKey);
        a_.call(BPF_FUNC_map_lookup_elem);
    }

    // Adds one to the u64 at each offset of a per-CPU array element (clobbers R0-R5).
    void count(int map, uint32_t key, const std::vector<int16_t>& fields) {
        Label none = a_.label();
        lookup(map, key);
        a_.jmp64(BPF_JEQ, R0, 0, none);
        for (int16_t f : fields) {
            a_.load(BPF_DW, R1, R0, f);
            a_.alu64(BPF_ADD, R1, 1);
            a_.store(BPF_DW, R0, f, R1);
        }
        a_.bind(none);
    }
    void count_gen(uint32_t which) { count(maps_.gen_counters, slot_ * MPS_GC_MAX + which, {0}); }
    static constexpr int16_t kRuns = offsetof(mps_step_counters, runs),
                             kMatched = offsetof(mps_step_counters, matched),
                             kDrops = offsetof(mps_step_counters, drops),
                             kMissed = offsetof(mps_step_counters, missed_tail_calls);
    void count_step(uint16_t pc, const std::vector<int16_t>& fields) {
        count(maps_.step_counters, slot_ * MPS_MAX_STEPS + pc, fields);
    }

    const std::vector<mps_step>& steps_;
    std::vector<uint16_t> order_;
    Hook hook_;
    bool xdp_;
    uint32_t live_, slot_;
    EntryMaps maps_;
    Asm a_;
    std::vector<Label> step_labels_;
    std::vector<uint8_t> reach_;
    bool mixed_ = false;
    Label end_, not_live_, not_ours_;
};

}  // namespace

std::optional<std::vector<bpf_insn>> emit_entry(const std::vector<mps_step>& steps, uint16_t first,
                                                Hook hook, uint32_t live, const EntryMaps& maps) {
    auto order = chain_order(steps, first);
    if (order.empty()) return std::nullopt;
    return Emitter(steps, std::move(order), hook, live, maps).emit();
}

}  // namespace mpsteer::datapath
