// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The entry emitter: one hook's chain (a ChainSet's steps, what src/compile made of the
// manifests) emitted as a BPF program of its own, instruction by instruction: a compiled
// entry, attached in place of the datapath's entry program (bpf/README.md, "Compiled
// entries"). Parameters become immediates and every step a compare and a jump; the program
// takes the common shape (Ethernet, IPv4 without options, TCP, not a SYN) and hands anything
// else, unchanged, to the entry program, which does it all. Generation::emit_entries() loads
// what this returns. Adding a selector: the checklist at the top of entry_emitter.cpp.
#pragma once

#include <linux/bpf.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "datapath/chain.h"

namespace mpsteer::datapath {

// Steps reachable from a compiled entry, at most (more: the entry program keeps the hook).
constexpr size_t kCompiledMaxSteps = 16;

// The datapath's maps a compiled entry uses, by file descriptor.
struct EntryMaps {
    int slots;  // the datapath's .bss: struct mps_slots (the live word)
    int jmp;    // jmp_xdp or jmp_tc: step programs, entry and preflight programs
    int step_counters;
    int gen_counters;
    int xdp_ctx;  // xdp_pkt_ctx: the per-packet context at XDP
};

// The program for the chain that starts at `first` on hook h, running while mps_slots.active
// (or .testing) equals `live`. Empty when the chain cannot be compiled: more than
// kCompiledMaxSteps steps, or a step that is neither inline nor a program.
std::optional<std::vector<bpf_insn>> emit_entry(const std::vector<mps_step>& steps, uint16_t first,
                                                Hook hook, uint32_t live, const EntryMaps& maps);

}  // namespace mpsteer::datapath
