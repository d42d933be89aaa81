/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The prog arrays and counters a chain runs with (compiled entries, emitted by
 * src/datapath/entry_emitter.cpp, use the same maps by file descriptor) and the branch-free
 * comparisons the interpreter's inline selectors are made of.
 */
#ifndef MPSTEER_LIB_CHAIN_MAPS_H
#define MPSTEER_LIB_CHAIN_MAPS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"

/* Slot MPS_PROG_NONE (0) holds the interpreter, slot N the actor program with enum value N,
 * MPS_JMP_ENTRY / MPS_JMP_PREFLIGHT + hook the entry programs. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, MPS_PROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
} jmp_xdp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, MPS_PROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
} jmp_tc SEC(".maps");

/* The per-packet context at XDP, one per CPU: a program run (entry, then every program it
 * tail-calls) finishes before the next starts on that CPU, and this line stays in the CPU's
 * cache. XDP metadata would do the same in the packet's headroom, a line no one else touched
 * and a cache miss on every packet (~40 % of record's time at XDP, live). TC uses skb->cb. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mps_pkt_ctx);
} xdp_pkt_ctx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MPS_SLOTS *MPS_MAX_STEPS);
	__type(key, __u32);
	__type(value, struct mps_step_counters);
} step_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MPS_SLOTS *MPS_GC_MAX);
	__type(key, __u32);
	__type(value, __u64);
} gen_counters SEC(".maps");

static __always_inline void gen_count_slot(__u32 slot, __u32 which)
{
	__u32 i = slot * MPS_GC_MAX + which;
	__u64 *c = bpf_map_lookup_elem(&gen_counters, &i);
	if (c)
		*c += 1;
}

/* Branch-free: a branch in a selector is paid per path by the verifier (and, in the compiled
 * entries, teaches it something about the packet on each side). */
static __always_inline __u64 is_zero(__u64 d)
{
	return 1 ^ ((d | -d) >> 63);
}

/* 1 when lo <= v <= hi. */
static __always_inline __u64 in_range(__u64 v, __u64 lo, __u64 hi)
{
	return 1 ^ ((((__s64)v - (__s64)lo) | ((__s64)hi - (__s64)v)) >> 63 & 1);
}

#endif
