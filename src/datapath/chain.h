// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The compiled form of a set of policies: what the compiler produces and the datapath loads.
// A plain value, built and compared without root; see bpf/README.md for the step semantics.
#pragma once

#include "net/hook.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern "C" {
#include "mpsteer/abi.h"
}

namespace mpsteer::datapath {

using mpsteer::Hook;
using mpsteer::hook_from_string;
using mpsteer::to_string;
static_assert(uint8_t(Hook::xdp) == MPS_HOOK_XDP &&
              uint8_t(Hook::tc_egress) == MPS_HOOK_TC_EGRESS &&
              uint8_t(Hook::tc_ingress) == MPS_HOOK_TC_INGRESS);

// Where a hook's chain starts. An empty ifname applies to every interface the hook is attached
// to; a named one overrides it for that interface (per-interface policy sets).
struct EntryPoint {
    Hook hook;
    std::string ifname;
    uint16_t pc;
    bool operator==(const EntryPoint&) const = default;
};

struct Attachment {
    std::string ifname;
    Hook hook;
    bool operator==(const Attachment&) const = default;
};

struct ChainSet {
    std::vector<mps_step> steps;  // pc = index; on_match/on_miss index this or MPS_PC_END
    std::vector<EntryPoint> entries;
    std::vector<std::string> policies;    // mps_step.policy indexes this (counters, status)
    std::vector<Attachment> attachments;  // where the entry programs go
    // Hooks whose entry learns handshakes where no chain starts (sorted): a rate_limit reads
    // the window scale from both SYNs, and its own hook sees only one direction's.
    std::vector<Hook> learning_hooks;
    // Steps whose parameter names an interface (redirect): the loader writes its ifindex.
    std::vector<std::pair<uint16_t, std::string>> step_ifnames;

    // Byte-exact serialisation (deterministic; used to compare generations and in tests).
    std::string serialize() const;
    // Human-readable listing, one step per line.
    std::string describe() const;
    // Structural checks the loader relies on: pcs in range, chains <= MPS_MAX_CHAIN deep,
    // no cycles, known programs. Returns the problems found (empty: valid).
    std::vector<std::string> check() const;
};

// Sets MPS_STEPF_GUARDED on each step from which a step with MPS_STEPF_FAIL_DROP is reachable
// (itself included) and clears it elsewhere: what the loader writes into a table slot. The
// steps must be acyclic (ChainSet::check()).
void mark_guarded(std::vector<mps_step>& steps);

// Step programs one packet may enter (each costs two tail calls; the kernel allows 33).
constexpr int kMaxActorsPerPath = 16;

// Per-interface entries (one per hook and interface a policy names) in one generation: the map
// holds the running generation's and the next one's during a swap.
constexpr size_t kMaxIfaceEntries = MPS_IFACE_ENTRIES_MAX / 2;

// Step constructors: fill the union correctly so callers never touch raw bytes.
mps_step make_step(mps_prog prog, uint16_t on_match, uint16_t on_miss = MPS_PC_END,
                   uint16_t policy = 0);

// The inline selector (struct mps_p_match), a test at a time: what every cheap selector is
// lowered to. Throws std::length_error past MPS_MATCH_TESTS tests.
class Match {
public:
    // family: 0 either, 4 or 6; either: also the tuple with source and destination exchanged.
    explicit Match(uint8_t family = 0, bool either = false);
    // lo <= (word & mask) <= hi.
    Match& test(mps_word word, uint32_t mask, uint32_t lo, uint32_t hi);
    // The address words from `base` (MPS_W_SRC / MPS_W_DST) in the prefix addr/bits (network
    // order, as on the wire; the family's word count); no test for a word the prefix leaves out.
    Match& prefix(mps_word base, const uint32_t addr[4], unsigned bits);
    mps_step step(uint16_t on_match, uint16_t on_miss = MPS_PC_END, uint16_t policy = 0) const;

private:
    mps_p_match p_{};
};
// Port ranges of a port selector: source, destination, or either (one test, both directions).
enum class PortDir { src, dst, either };
Match port_match(PortDir dir, uint16_t lo, uint16_t hi);
// Any of the packet kinds (MPS_K_*).
Match kinds_match(uint32_t any_of);
// Source or destination in the IPv4 prefix addr/prefix (the benchmarks' chains), miss -> end.
mps_step cidr4_step(mps_word base, const char* addr, uint8_t prefix, uint16_t on_match = 0);
std::string_view prog_name(mps_prog p);

// "10.0.1.1:40000 <-> 10.0.2.2:80" (IPv6 endpoints in brackets), in the key's own order.
std::string to_string(const mps_flow_key& k);
// Whether a step runs in its own program (reached by tail call) rather than inline in the
// interpreter (the cheap selectors, pass and drop): MPS_PROGRAMS' `inline` column.
constexpr bool has_program(mps_prog p) {
    switch (p) {
#define MPS_PROG_OWN(e, value, name, inl, options) \
    case e: return !(inl);
        MPS_PROGRAMS(MPS_PROG_OWN)
#undef MPS_PROG_OWN
    default: return false;
    }
}
// "sel_match", "act_record", ... (MPS_PROGRAMS' names) -> the program.
std::optional<mps_prog> prog_from_name(std::string_view name);

}  // namespace mpsteer::datapath
