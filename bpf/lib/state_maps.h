/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The shared state maps, defined once for both BPF objects (datapath.bpf.c and ctl.bpf.c).
 * The agent creates and pins them (StateMaps::open, "<name>_v<MPS_STATE_LAYOUT>") and every
 * load of either object reuses them by file descriptor, so these definitions must match what
 * StateMaps creates: one definition here keeps the two objects from drifting apart.
 * Layouts in include/mpsteer/abi.h.
 */
#ifndef MPSTEER_LIB_STATE_MAPS_H
#define MPSTEER_LIB_STATE_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"

/* Flow state, both directions of a subflow in one entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, struct mps_flow_key);
	__type(value, struct mps_flow);
} flows SEC(".maps");

/* Connection state under the lower token (and an alias under the higher one). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, __u32);
	__type(value, struct mps_conn);
} conns SEC(".maps");

/* struct mps_event records for the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, MPS_EVENTS_BYTES);
} events SEC(".maps");

/* The option-rewriting actors' memory (rewrite.h and one header per actor): ADD_ADDRs blk_subflow
 * hid, add_subflow requests from userspace, what set_backup signalled per subflow. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, struct mps_announce_key);
	__type(value, struct mps_announce);
} announces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, struct mps_flow_key);
	__type(value, struct mps_add_request);
} add_requests SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, struct mps_flow_key);
	__type(value, struct mps_prio_sent);
} prio_sent SEC(".maps");

/* Entries the datapath added to the LRU tables (enum mps_table_counter): evictions for the
 * agent's metrics. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MPS_TI_MAX);
	__type(key, __u32);
	__type(value, __u64);
} table_inserts SEC(".maps");

static __always_inline void count_insert(__u32 table)
{
	__u64 *n = bpf_map_lookup_elem(&table_inserts, &table);
	if (n) /* per CPU: no other writer */
		*n += 1;
}
#endif
