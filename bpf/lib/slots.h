/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The two generation slots (mps_slots) and the per-interface entries; which slot a packet runs.
 */
#ifndef MPSTEER_LIB_SLOTS_H
#define MPSTEER_LIB_SLOTS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"
#include "chain_maps.h"

/*
 * The agent writes a generation into the slot no packet uses (through the mmapped .bss), flips
 * mps_slots.active, and waits for an RCU grace period before it writes the old slot again. A packet
 * reads mps_slots.active once, in its entry program, and carries the slot in its context
 * (MPS_CTXF_SLOT1), so it runs one generation from start to end. The preflight entries run
 * the slot in mps_slots.staged: the agent tests a generation before any packet can see it.
 */
struct mps_slots mps_slots;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MPS_IFACE_ENTRIES_MAX);
	__type(key, struct mps_iface_key);
	__type(value, __u16);
} iface_entries SEC(".maps");

static __always_inline __u32 ctx_slot(const struct mps_pkt_ctx *pc)
{
	return (pc->flags / MPS_CTXF_SLOT1) & 1;
}

static __always_inline void gen_count(const struct mps_pkt_ctx *pc, __u32 which)
{
	gen_count_slot(ctx_slot(pc), which);
}

#endif
