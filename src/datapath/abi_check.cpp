// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The ABI's layout, pinned: the size and every field offset of each struct that the BPF
// programs and the agent both read (bpf/include/mpsteer/abi.h), written as literal numbers.
// A layout change fails the build here; when it is meant, update the numbers and, for a
// shared map's struct, bump MPS_STATE_LAYOUT (pinned maps of the old layout are then left
// alone instead of misread). tests/bpf/CMakeLists.txt proves that a perturbed layout fails
// (abi_layout_probe). Only offsets and sizes: x86-64, arm64 and armhf agree with BPF on
// these (natural alignment, no bitfields).
#include <cstddef>

extern "C" {
#include "mpsteer/abi.h"
}

#define MPS_ABI_SIZE(T, n) static_assert(sizeof(T) == (n), "size of " #T " (abi.h)")
#define MPS_ABI_FIELD(T, f, off) static_assert(offsetof(T, f) == (off), #T "." #f " moved (abi.h)")

// ---- prog-array slots ------------------------------------------------------------------------
// Programs sit at their enum value (chain.cpp checks every named one is below MPS_JMP_ENTRY),
// the entry and preflight programs above them; all of it inside the prog arrays.
static_assert(MPS_JMP_ENTRY + MPS_HOOK_MAX <= MPS_JMP_PREFLIGHT, "entry slots overlap preflight");
static_assert(MPS_JMP_PREFLIGHT + MPS_HOOK_MAX <= MPS_JMP_OPT_WALK,
              "preflight slots overlap the option walk's");
static_assert(MPS_JMP_OPT_WALK < MPS_PROG_MAX, "the option walk's slot beyond the prog arrays");
static_assert(MPS_ACT_REDIRECT < MPS_JMP_ENTRY, "program slots overlap the entry slots");
static_assert((MPS_MAX_STEPS & (MPS_MAX_STEPS - 1)) == 0, "pcs are masked: a power of two");
static_assert(MPS_MAX_STEPS <= MPS_PC_END, "a pc fits a __u16 below MPS_PC_END");

// ---- the per-packet context (XDP data_meta, TC skb->cb: 20 bytes at most) -------------------
MPS_ABI_SIZE(mps_pkt_ctx, 20);
MPS_ABI_FIELD(mps_pkt_ctx, pc, 0);
MPS_ABI_FIELD(mps_pkt_ctx, hops, 2);
MPS_ABI_FIELD(mps_pkt_ctx, flags, 3);
MPS_ABI_FIELD(mps_pkt_ctx, family, 4);
MPS_ABI_FIELD(mps_pkt_ctx, hook, 5);
MPS_ABI_FIELD(mps_pkt_ctx, l3_off, 6);
MPS_ABI_FIELD(mps_pkt_ctx, l4_off, 8);
MPS_ABI_FIELD(mps_pkt_ctx, l4_len, 10);
MPS_ABI_FIELD(mps_pkt_ctx, kinds, 12);
MPS_ABI_FIELD(mps_pkt_ctx, scratch, 16);

// ---- steps: parameters, the step (128 bytes: a pc indexes the table) -------------------------
MPS_ABI_SIZE(mps_p_match, 120);
MPS_ABI_FIELD(mps_p_match, families, 0);
MPS_ABI_FIELD(mps_p_match, flags, 1);
MPS_ABI_FIELD(mps_p_match, n, 2);
MPS_ABI_FIELD(mps_p_match, word, 3);
MPS_ABI_FIELD(mps_p_match, mask, 12);
MPS_ABI_FIELD(mps_p_match, lo, 48);
MPS_ABI_FIELD(mps_p_match, hi, 84);

MPS_ABI_SIZE(mps_p_token, 4);
MPS_ABI_FIELD(mps_p_token, token, 0);

MPS_ABI_SIZE(mps_p_seq, 24);
MPS_ABI_FIELD(mps_p_seq, kind, 0);
MPS_ABI_FIELD(mps_p_seq, pad, 1);
MPS_ABI_FIELD(mps_p_seq, lo, 8);
MPS_ABI_FIELD(mps_p_seq, hi, 16);

MPS_ABI_SIZE(mps_p_bytes, 24);
MPS_ABI_FIELD(mps_p_bytes, scope, 0);
MPS_ABI_FIELD(mps_p_bytes, pad, 1);
MPS_ABI_FIELD(mps_p_bytes, lo, 8);
MPS_ABI_FIELD(mps_p_bytes, hi, 16);

MPS_ABI_SIZE(mps_p_rate, 16);
MPS_ABI_FIELD(mps_p_rate, bytes_per_sec, 0);
MPS_ABI_FIELD(mps_p_rate, rtt_us, 8);
MPS_ABI_FIELD(mps_p_rate, min_window, 12);

MPS_ABI_SIZE(mps_p_backup, 2);
MPS_ABI_FIELD(mps_p_backup, backup, 0);
MPS_ABI_FIELD(mps_p_backup, every_packet, 1);

MPS_ABI_SIZE(mps_p_add, 16);
MPS_ABI_FIELD(mps_p_add, on_bytes, 0);
MPS_ABI_FIELD(mps_p_add, pad, 1);
MPS_ABI_FIELD(mps_p_add, after_bytes, 8);

MPS_ABI_SIZE(mps_p_redirect, 4);
MPS_ABI_FIELD(mps_p_redirect, ifindex, 0);

MPS_ABI_SIZE(mps_param, 120);
MPS_ABI_FIELD(mps_param, match, 0);
MPS_ABI_FIELD(mps_param, token, 0);
MPS_ABI_FIELD(mps_param, seq, 0);
MPS_ABI_FIELD(mps_param, bytes, 0);
MPS_ABI_FIELD(mps_param, rate, 0);
MPS_ABI_FIELD(mps_param, backup, 0);
MPS_ABI_FIELD(mps_param, add, 0);
MPS_ABI_FIELD(mps_param, redirect, 0);
MPS_ABI_FIELD(mps_param, raw, 0);

MPS_ABI_SIZE(mps_step, 128);
MPS_ABI_FIELD(mps_step, prog, 0);
MPS_ABI_FIELD(mps_step, flags, 1);
MPS_ABI_FIELD(mps_step, on_match, 2);
MPS_ABI_FIELD(mps_step, on_miss, 4);
MPS_ABI_FIELD(mps_step, policy, 6);
MPS_ABI_FIELD(mps_step, p, 8);

// ---- generations: entries, per-interface keys, tables, slots (the mmapped .bss) -------------
MPS_ABI_SIZE(mps_entry, 8);
MPS_ABI_FIELD(mps_entry, pc, 0);
MPS_ABI_FIELD(mps_entry, flags, 2);
MPS_ABI_FIELD(mps_entry, gen, 4);

MPS_ABI_SIZE(mps_iface_key, 8);
MPS_ABI_FIELD(mps_iface_key, ifindex, 0);
MPS_ABI_FIELD(mps_iface_key, hook, 4);
MPS_ABI_FIELD(mps_iface_key, slot, 6);

MPS_ABI_SIZE(mps_table, 131104);
MPS_ABI_FIELD(mps_table, entries, 0);
MPS_ABI_FIELD(mps_table, steps, 32);

MPS_ABI_SIZE(mps_slots, 262224);
MPS_ABI_FIELD(mps_slots, active, 0);
MPS_ABI_FIELD(mps_slots, staged, 4);
MPS_ABI_FIELD(mps_slots, testing, 8);
MPS_ABI_FIELD(mps_slots, pad, 12);
MPS_ABI_FIELD(mps_slots, tables, 16);

// ---- counters -------------------------------------------------------------------------------
MPS_ABI_SIZE(mps_step_counters, 32);
MPS_ABI_FIELD(mps_step_counters, runs, 0);
MPS_ABI_FIELD(mps_step_counters, matched, 8);
MPS_ABI_FIELD(mps_step_counters, drops, 16);
MPS_ABI_FIELD(mps_step_counters, missed_tail_calls, 24);

// ---- shared state: flows and connections ----------------------------------------------------
MPS_ABI_SIZE(mps_flow_key, 40);
MPS_ABI_FIELD(mps_flow_key, a, 0);
MPS_ABI_FIELD(mps_flow_key, b, 16);
MPS_ABI_FIELD(mps_flow_key, port_a, 32);
MPS_ABI_FIELD(mps_flow_key, port_b, 34);
MPS_ABI_FIELD(mps_flow_key, family, 36);
MPS_ABI_FIELD(mps_flow_key, pad, 37);

MPS_ABI_SIZE(mps_flow_dir, 40);
MPS_ABI_FIELD(mps_flow_dir, packets, 0);
MPS_ABI_FIELD(mps_flow_dir, bytes, 8);
MPS_ABI_FIELD(mps_flow_dir, isn, 16);
MPS_ABI_FIELD(mps_flow_dir, ts_val, 20);
MPS_ABI_FIELD(mps_flow_dir, ts_sent_ns, 24);
MPS_ABI_FIELD(mps_flow_dir, wscale, 32);
MPS_ABI_FIELD(mps_flow_dir, wscale_known, 33);
MPS_ABI_FIELD(mps_flow_dir, wscale_sent, 34);
MPS_ABI_FIELD(mps_flow_dir, pad, 35);

MPS_ABI_SIZE(mps_flow, 216);
MPS_ABI_FIELD(mps_flow, dir_ab, 0);
MPS_ABI_FIELD(mps_flow, last_ns, 40);
MPS_ABI_FIELD(mps_flow, conn_token, 48);
MPS_ABI_FIELD(mps_flow, srtt_us, 52);
MPS_ABI_FIELD(mps_flow, rttvar_us, 56);
MPS_ABI_FIELD(mps_flow, ended, 60);
MPS_ABI_FIELD(mps_flow, rate_bps, 64);
MPS_ABI_FIELD(mps_flow, role, 72);
MPS_ABI_FIELD(mps_flow, backup, 73);
MPS_ABI_FIELD(mps_flow, pad, 74);
MPS_ABI_FIELD(mps_flow, hidden_ids, 76);
MPS_ABI_FIELD(mps_flow, first_ns, 80);
MPS_ABI_FIELD(mps_flow, key, 88);
MPS_ABI_FIELD(mps_flow, idsn, 104);
MPS_ABI_FIELD(mps_flow, token, 120);
MPS_ABI_FIELD(mps_flow, dir_ba, 128);
MPS_ABI_FIELD(mps_flow, conn_packets, 168);
MPS_ABI_FIELD(mps_flow, conn_bytes, 176);
MPS_ABI_FIELD(mps_flow, rate_edge_ns, 184);
MPS_ABI_FIELD(mps_flow, rate_edge, 200);
MPS_ABI_FIELD(mps_flow, rate_most, 208);
// The directions' counters, written from two CPUs, never share a cache line.
static_assert(offsetof(mps_flow, dir_ba) - sizeof(mps_flow_dir) >= 64, "flow directions too close");

MPS_ABI_SIZE(mps_conn, 48);
MPS_ABI_FIELD(mps_conn, packets, 0);
MPS_ABI_FIELD(mps_conn, bytes, 8);
MPS_ABI_FIELD(mps_conn, first_ns, 16);
MPS_ABI_FIELD(mps_conn, last_ns, 24);
MPS_ABI_FIELD(mps_conn, token, 32);
MPS_ABI_FIELD(mps_conn, subflows, 40);
MPS_ABI_FIELD(mps_conn, pad, 44);

// ---- events ---------------------------------------------------------------------------------
MPS_ABI_SIZE(mps_event, 88);
MPS_ABI_FIELD(mps_event, type, 0);
MPS_ABI_FIELD(mps_event, gen, 4);
MPS_ABI_FIELD(mps_event, ts_ns, 8);
MPS_ABI_FIELD(mps_event, flow, 16);
MPS_ABI_FIELD(mps_event, from_a, 56);
MPS_ABI_FIELD(mps_event, hook, 57);
MPS_ABI_FIELD(mps_event, version, 58);
MPS_ABI_FIELD(mps_event, flags, 59);
MPS_ABI_FIELD(mps_event, addr_id, 60);
MPS_ABI_FIELD(mps_event, pad, 61);
MPS_ABI_FIELD(mps_event, token, 64);
MPS_ABI_FIELD(mps_event, nonce, 68);
MPS_ABI_FIELD(mps_event, key, 72);

// ---- the option-rewriting actors' state -----------------------------------------------------
MPS_ABI_SIZE(mps_announce_key, 44);
MPS_ABI_FIELD(mps_announce_key, flow, 0);
MPS_ABI_FIELD(mps_announce_key, addr_id, 40);
MPS_ABI_FIELD(mps_announce_key, pad, 41);

MPS_ABI_SIZE(mps_announce, 96);
MPS_ABI_FIELD(mps_announce, first_ns, 0);
MPS_ABI_FIELD(mps_announce, last_ns, 8);
MPS_ABI_FIELD(mps_announce, released_ns, 16);
MPS_ABI_FIELD(mps_announce, state, 24);
MPS_ABI_FIELD(mps_announce, hidden, 28);
MPS_ABI_FIELD(mps_announce, conn_token, 32);
MPS_ABI_FIELD(mps_announce, from_a, 36);
MPS_ABI_FIELD(mps_announce, hook, 37);
MPS_ABI_FIELD(mps_announce, family, 38);
MPS_ABI_FIELD(mps_announce, len, 39);
MPS_ABI_FIELD(mps_announce, port, 40);
MPS_ABI_FIELD(mps_announce, pad, 42);
MPS_ABI_FIELD(mps_announce, addr, 44);
MPS_ABI_FIELD(mps_announce, opt, 60);
MPS_ABI_FIELD(mps_announce, pad2, 92);

MPS_ABI_SIZE(mps_add_request, 16);
MPS_ABI_FIELD(mps_add_request, addr_id, 0);
MPS_ABI_FIELD(mps_add_request, pad, 1);
MPS_ABI_FIELD(mps_add_request, requested_ns, 8);

MPS_ABI_SIZE(mps_prio_sent, 24);
MPS_ABI_FIELD(mps_prio_sent, sent, 0);
MPS_ABI_FIELD(mps_prio_sent, pad, 2);
MPS_ABI_FIELD(mps_prio_sent, ns, 8);

MPS_ABI_SIZE(mps_prio_tmpl_key, 44);
MPS_ABI_FIELD(mps_prio_tmpl_key, flow, 0);
MPS_ABI_FIELD(mps_prio_tmpl_key, dir, 40);
MPS_ABI_FIELD(mps_prio_tmpl_key, pad, 41);

MPS_ABI_SIZE(mps_prio_tmpl, 152);
MPS_ABI_FIELD(mps_prio_tmpl, ns, 0);
MPS_ABI_FIELD(mps_prio_tmpl, ifindex, 8);
MPS_ABI_FIELD(mps_prio_tmpl, pc, 12);
MPS_ABI_FIELD(mps_prio_tmpl, hook, 14);
MPS_ABI_FIELD(mps_prio_tmpl, family, 15);
MPS_ABI_FIELD(mps_prio_tmpl, l3_off, 16);
MPS_ABI_FIELD(mps_prio_tmpl, l4_off, 18);
MPS_ABI_FIELD(mps_prio_tmpl, len, 20);
MPS_ABI_FIELD(mps_prio_tmpl, next, 22);
MPS_ABI_FIELD(mps_prio_tmpl, hdr, 24);

// ---- control requests (bpf/ctl.bpf.c) -------------------------------------------------------
MPS_ABI_SIZE(mps_ctl_flow_req, 80);
MPS_ABI_FIELD(mps_ctl_flow_req, key, 0);
MPS_ABI_FIELD(mps_ctl_flow_req, set, 40);
MPS_ABI_FIELD(mps_ctl_flow_req, conn_token, 44);
MPS_ABI_FIELD(mps_ctl_flow_req, token, 48);
MPS_ABI_FIELD(mps_ctl_flow_req, idsn, 56);
MPS_ABI_FIELD(mps_ctl_flow_req, rate_bps, 72);
