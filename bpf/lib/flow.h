/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flow learning and accounting: SYNs learnt into the flow table, timestamps and RTT, the
 * tick clock, per-flow counts handed over to the connection, FIN/RST ending a flow.
 */
#ifndef MPSTEER_LIB_FLOW_H
#define MPSTEER_LIB_FLOW_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "slots.h"
#include "packet.h"
#include "options.h"
#include "events.h"

/* Both sides' SYNs seen (SYN and SYN/ACK). */
static __always_inline bool handshake_done(const struct mps_flow *f)
{
	return f->dir_ab.wscale_known && f->dir_ba.wscale_known;
}

/* Whether a SYN may start the 4-tuple afresh: the flow ended, or it holds nothing a completed
 * handshake or the agent wrote (a SYN retransmitted, an entry made mid-stream). */
static __always_inline bool flow_restartable(const struct mps_flow *f)
{
	if (f->ended & MPS_FLOW_CLOSED)
		return true;
	return !handshake_done(f) && !(f->key[0] | f->key[1]) && !f->rate_bps && !f->conn_token;
}

/*
 * A SYN teaches the flow its ISN, window scale and MPTCP role. Done in the entry program
 * (SYNs are rare) so rate_limit knows the scale whichever steps saw the SYN.
 */
static const struct mps_flow zero_flow;

static __always_inline void learn_syn(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;
	__u32 len;

	struct opt_locs locs, *loc = &locs;
	if (scan(ctx, xdp, pc, loc) || load_tuple(ctx, xdp, pc, &t))
		return;
	flow_key(&t, pc->family, &k, &from_a);
	bool synack = pc->kinds & MPS_K_ACK;
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	/* One spoofed SYN or SYN/ACK must not rewrite a live flow (its keys, window scales,
	 * rate): a completed handshake is kept until the flow ends. */
	if (f && handshake_done(f) && !(f->ended & MPS_FLOW_CLOSED))
		return;
	if (!f || (!synack && flow_restartable(f))) {
		/* A SYN (not SYN/ACK) starts the flow afresh: older state is from a dead flow. */
		if (bpf_map_update_elem(&flows, &k, &zero_flow, BPF_ANY) == 0 && !f)
			count_insert(MPS_TI_FLOWS);
		f = bpf_map_lookup_elem(&flows, &k);
		if (!f)
			return;
		f->first_ns = bpf_ktime_get_coarse_ns();
	}
	if (f->ended & MPS_FLOW_CLOSED) /* a SYN/ACK for a flow no SYN restarted */
		return;
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return;
	__u32 d = from_a ? 0 : 1;
	MPS_FLOW_DIR(f, d)->isn = bpf_ntohl(tcp->seq);
	__u8 *ws = opt_ptr(ctx, xdp, pc, loc, OPT_WSCALE, 3, &len);
	MPS_FLOW_DIR(f, d)->wscale = ws ? (ws[2] > 14 ? 14 : ws[2]) : 0; /* RFC 7323 clamps to 14 */
	MPS_FLOW_DIR(f, d)->wscale_known = 1;
	MPS_FLOW_DIR(f, d)->wscale_sent = ws != NULL;
	if (pc->kinds & MPS_K_MP_JOIN) {
		f->role = MPS_ROLE_JOIN;
		/* MP_JOIN SYN (length 12): the token is the receiver's, i.e. the other side's. */
		__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_JOIN, 12, &len);
		if (o && !synack && len == 12) {
			__u32 tok = load_be32_h(o + 4);
			f->token[d ^ 1] = tok;
			f->backup = o[2] & 1;
			struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
			if (c && c->token[0] != tok) { /* the higher token: an alias entry */
				__u32 canon = c->token[0];
				c = bpf_map_lookup_elem(&conns, &canon);
			}
			/* Linked only to a connection entry that exists; otherwise the agent links
			 * it (and counts the subflow) when it sees the MP_JOIN event. */
			f->conn_token = c ? c->token[0] : 0;
			if (c) /* counted here: the agent never rewrites a connection entry */
				__sync_fetch_and_add(&c->subflows, 1);
		}
	} else if (pc->kinds & MPS_K_MP_CAPABLE) {
		f->role = MPS_ROLE_INITIAL;
	}
}

#ifndef MPS_NO_KERNEL_BTF /* there the walk program learns SYNs */
/* Nonzero when the options are malformed (the packet then passes untouched). */
MPS_CTX_SUBPROG int learn_syn_xdp(struct xdp_md *ctx, struct mps_pkt_ctx *pc)
{
	if (!pc)
		return -1;
	learn_syn(ctx, true, pc);
	return !(pc->flags & MPS_CTXF_SCANNED);
}

MPS_CTX_SUBPROG int learn_syn_tc(struct __sk_buff *ctx, struct mps_pkt_ctx *pc)
{
	if (!pc)
		return -1;
	learn_syn(ctx, false, pc);
	return !(pc->flags & MPS_CTXF_SCANNED);
}
#endif

/* TSval and TSecr of a segment, or nonzero when it has none (or malformed options). Linux
 * and most stacks put the option first, after two NOPs, on every segment past the handshake:
 * read there without the option walk; any other layout takes the walk. */
static __always_inline int load_timestamps(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					   __u32 *tsval, __u32 *tsecr)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u8 *o = (__u8 *)(tcp + 1);
	if (tcp->doff >= 8 && (void *)(o + 12) <= ctx_end(ctx, xdp) && o[0] == 1 && o[1] == 1 &&
	    o[2] == 8 && o[3] == 10) {
		*tsval = load_be32_h(o + 4);
		*tsecr = load_be32_h(o + 8);
		return 0;
	}
	struct opt_locs locs, *loc = &locs;
	__u32 len;
	if (scan(ctx, xdp, pc, loc) || !(pc->kinds & MPS_K_TIMESTAMP))
		return -1;
	o = opt_ptr(ctx, xdp, pc, loc, OPT_TS, 10, &len);
	if (!o)
		return -1;
	*tsval = load_be32_h(o + 2);
	*tsecr = load_be32_h(o + 6);
	return 0;
}

/* RTT from timestamps: one TSval per direction is remembered when it leaves; the first echo of
 * it (or of a later one) coming back closes the sample. Only a TSval sent at egress echoed back
 * at ingress measures this host's path RTT; the other way round it measures the local stack's
 * turnaround (which mixed in, once put srtt at 8 ms on a 20 ms path). A packet with no sample
 * to open or close reads no option. */
static __always_inline void sample_rtt(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
				       struct mps_flow *f, __u32 d)
{
	__u32 od = d ^ 1, tsval, tsecr;
	bool egress = pc->hook == MPS_HOOK_TC_EGRESS;
	if (egress ? MPS_FLOW_DIR(f, d)->ts_sent_ns != 0 : MPS_FLOW_DIR(f, od)->ts_sent_ns == 0)
		return;
	if (load_timestamps(ctx, xdp, pc, &tsval, &tsecr))
		return;
	if (egress) {
		MPS_FLOW_DIR(f, d)->ts_val = tsval;
		MPS_FLOW_DIR(f, d)->ts_sent_ns = bpf_ktime_get_ns();
		return;
	}
	/* Most packets arriving while a sample is open echo an older TSval: they leave before
	 * the clock read (a helper call, per packet). */
	if ((__s32)(tsecr - MPS_FLOW_DIR(f, od)->ts_val) < 0)
		return;
	__u64 sample = (bpf_ktime_get_ns() - MPS_FLOW_DIR(f, od)->ts_sent_ns) / 1000;
	MPS_FLOW_DIR(f, od)->ts_sent_ns = 0;
	if (sample == 0 || sample >= 60000000)
		return;
	__u32 srtt = f->srtt_us;
	if (!srtt) {
		f->srtt_us = sample;
		f->rttvar_us = sample / 2;
		return;
	}
	__s64 diff = (__s64)sample - srtt;
	if (diff < 0)
		diff = -diff;
	f->rttvar_us = (3 * (__u64)f->rttvar_us + diff) / 4;
	f->srtt_us = (7 * (__u64)srtt + sample) / 8;
}

/* The coarse clock as of this CPU's last read in the current tick. */
struct tick_clock {
	__u64 jiffies, ns;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tick_clock);
} tick_clocks SEC(".maps");

/* The coarse clock, read once per tick per CPU. bpf_jiffies64 is a load the verifier inlines,
 * the coarse clock a helper call, and live every call costs far more than its work (each
 * return goes through the SRSO return thunk on the machines measured). Both move at the tick,
 * so the value kept while jiffies stays the same is the coarse clock's, at most a tick behind
 * when read as the tick turns. */
static __always_inline __u64 tick_ns(void)
{
	__u32 zero = 0;
	struct tick_clock *c = bpf_map_lookup_elem(&tick_clocks, &zero);
	if (!c)
		return bpf_ktime_get_coarse_ns();
	__u64 j = bpf_jiffies64();
	if (c->jiffies != j) {
		c->jiffies = j;
		c->ns = bpf_ktime_get_coarse_ns();
	}
	return c->ns;
}

/* Moves `total - *held` into `*into` and `*held` to `total`, once whichever CPUs race. */
static __always_inline void move_counted(__u64 *held, __u64 total, __u64 *into)
{
	__u64 was = *held;
	if (total > was && __sync_val_compare_and_swap(held, was, total) == was)
		__sync_fetch_and_add(into, total - was);
}

/*
 * Adds to the flow's connection entry what the flow counted since the last time. Once per tick
 * and at a FIN or RST, not per packet: on every packet it was a second hash lookup, the
 * costliest part of record (docs/performance.md, "What keeps the live cost down"). A
 * connection's entry thus lags its linked flows by up to a tick while they send; readers that
 * need it exact add the flows' part (bytes_seen(), the agent's read).
 */
static __always_inline void conn_catch_up(struct mps_flow *f, __u64 now)
{
	__u32 tok = f->conn_token;
	struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
	if (!c)
		return;
	move_counted(&f->conn_packets, MPS_FLOW_PACKETS(f), &c->packets);
	move_counted(&f->conn_bytes, MPS_FLOW_BYTES(f), &c->bytes);
	if (now > c->last_ns)
		c->last_ns = now;
}

/*
 * Per-packet accounting (record, flow_bytes): packets, payload bytes, timestamps-based RTT.
 * Runs once per packet however many steps ask. Returns the flow (or NULL). The times are to
 * the clock tick (tick_ns); the precise clock only for an RTT sample.
 */
static __always_inline struct mps_flow *account(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
						__u8 *from_a_out)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;

	if (load_tuple(ctx, xdp, pc, &t))
		return NULL;
	flow_key(&t, pc->family, &k, &from_a);
	*from_a_out = from_a;
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	if (pc->flags & MPS_CTXF_ACCOUNTED)
		return f;
	pc->flags |= MPS_CTXF_ACCOUNTED;

	__u64 now = tick_ns();
	if (!f) {
		if (bpf_map_update_elem(&flows, &k, &zero_flow, BPF_NOEXIST) == 0)
			count_insert(MPS_TI_FLOWS);
		f = bpf_map_lookup_elem(&flows, &k);
		if (!f)
			return NULL;
		f->first_ns = now;
	}
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return f;
	__u32 d = from_a ? 0 : 1;
	__u32 payload = pc->l4_len - tcp->doff * 4;
	__sync_fetch_and_add(&MPS_FLOW_DIR(f, d)->packets, 1);
	__sync_fetch_and_add(&MPS_FLOW_DIR(f, d)->bytes, payload);
	/* Forward only: CPUs that read the coarse clock as the tick turned may hold one tick
	 * apart, and a flow seen from both would otherwise move back and forth. */
	bool new_tick = now > f->last_ns;
	if (new_tick)
		f->last_ns = now;
	if (f->conn_token && (new_tick || tcp->fin || tcp->rst))
		conn_catch_up(f, now);
	sample_rtt(ctx, xdp, pc, f, d);
	return f;
}

/*
 * FIN or RST: a FIN from each side, or a RST, ends the flow: marked closed and reported once
 * (MPS_EV_FLOW_CLOSED) so the agent forgets it; the entry stays for the LRU or the next SYN.
 * Flows the datapath holds no entry for are not reported. Done in the entry program (rare
 * packets; the compiled entries hand them on).
 */
static __always_inline void learn_close(void *ctx, bool xdp, struct mps_pkt_ctx *pc, bool rst)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;
	if (load_tuple(ctx, xdp, pc, &t))
		return;
	flow_key(&t, pc->family, &k, &from_a);
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	if (!f || (f->ended & MPS_FLOW_CLOSED))
		return;
	__u32 now = rst ? MPS_FLOW_CLOSED : (from_a ? MPS_FLOW_FIN_A : MPS_FLOW_FIN_B);
	__u32 was = __sync_fetch_and_or(&f->ended, now);
	__u32 is = was | now;
	if (!rst && (is & (MPS_FLOW_FIN_A | MPS_FLOW_FIN_B)) == (MPS_FLOW_FIN_A | MPS_FLOW_FIN_B)) {
		was = __sync_fetch_and_or(&f->ended, MPS_FLOW_CLOSED);
		is |= MPS_FLOW_CLOSED;
	}
	if (!(is & MPS_FLOW_CLOSED) || (was & MPS_FLOW_CLOSED)) /* open, or another CPU reported */
		return;
	struct mps_event *ev = event_new(MPS_EV_FLOW_CLOSED, pc, &t);
	if (!ev)
		return;
	ev->flags = rst;
	bpf_ringbuf_submit(ev, 0);
}

MPS_CTX_SUBPROG int learn_close_xdp(struct xdp_md *ctx, struct mps_pkt_ctx *pc, int rst)
{
	if (!pc)
		return -1;
	learn_close(ctx, true, pc, rst);
	return 0;
}

MPS_CTX_SUBPROG int learn_close_tc(struct __sk_buff *ctx, struct mps_pkt_ctx *pc, int rst)
{
	if (!pc)
		return -1;
	learn_close(ctx, false, pc, rst);
	return 0;
}

/* Payload bytes counted so far on the subflow (both directions) or, with `conn`, on its
 * connection once linked (until then the subflow is all there is): the entry's count plus
 * what this flow has not handed over yet (conn_catch_up()); the other subflows' last tick is
 * not in it. A connection has carried at least what any of its subflows has, even when its
 * entry was made anew. */
static __always_inline __u64 bytes_seen(const struct mps_flow *f, bool conn)
{
	__u64 seen = MPS_FLOW_BYTES(f);
	if (conn && f->conn_token) {
		__u64 held = f->conn_bytes;
		__u32 tok = f->conn_token;
		struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
		__u64 total = c ? c->bytes + (seen > held ? seen - held : 0) : 0;
		if (total > seen)
			seen = total;
	}
	return seen;
}

#endif
