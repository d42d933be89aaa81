/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The actors that read flow state and options without rewriting them: get_connect,
 * get_subflow, and rate_limit (which rewrites the receive window only).
 */
#ifndef MPSTEER_LIB_ACTORS_H
#define MPSTEER_LIB_ACTORS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "packet.h"
#include "options.h"
#include "flow.h"
#include "events.h"
#include "selectors.h"

/* ---- actors ----------------------------------------------------------------------------- */

/* An actor answers 1 (applied), 0 (not applicable) or -1 (malformed: pass untouched);
 * afterwards the chain continues at on_match. pass and drop are verdicts of the interpreter. */

/* MP_CAPABLE with keys: keep them in the flow (never lost), then report them. */
static __always_inline int act_get_connect(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	__u32 len;
	struct opt_locs locs, *loc = &locs;
	if (scan(ctx, xdp, pc, loc))
		return -1;
	if (!(pc->kinds & MPS_K_MP_CAPABLE))
		return 0;
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_MPC, 12, &len);
	if (!o)
		return 0;
	__u64 k0 = load_be64(o + 4), k1 = 0;
	__u8 version = o[2] & 0x0f, flags = o[3];
	if (len >= 20) {
		o = opt_ptr(ctx, xdp, pc, loc, OPT_MPC, 20, &len);
		if (!o)
			return 0;
		k1 = load_be64(o + 12);
	}

	struct mps_flow_key k;
	__u8 from_a;
	flow_key(&t, pc->family, &k, &from_a);
	/* Only for a flow whose MP_CAPABLE handshake the datapath saw, and only what it did not
	 * know yet: a packet with made-up keys creates no connection state and no event, and
	 * cannot replace the keys of a live connection. */
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	if (!f || f->role != MPS_ROLE_INITIAL || (f->ended & MPS_FLOW_CLOSED))
		return 0;
	/* The first key is the sender's; a third ACK also carries the receiver's. */
	__u32 mine = from_a ? 0 : 1;
	bool fresh = false;
	if (!f->key[mine]) {
		f->key[mine] = k0;
		fresh = true;
	}
	if (k1 && !f->key[mine ^ 1]) {
		f->key[mine ^ 1] = k1;
		fresh = true;
	}
	if (!fresh)
		return 1;
	struct mps_event *ev = event_new(MPS_EV_MP_CAPABLE, pc, &t);
	if (!ev)
		return 1;
	ev->version = version;
	ev->flags = flags;
	ev->key[0] = k0;
	ev->key[1] = k1;
	bpf_ringbuf_submit(ev, 0);
	return 1;
}

/* MP_JOIN SYN: report the token (the entry program already stored it in the flow). */
static __always_inline int act_get_subflow(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	__u32 len;
	struct opt_locs locs, *loc = &locs;
	if (scan(ctx, xdp, pc, loc))
		return -1;
	if ((pc->kinds & (MPS_K_MP_JOIN | MPS_K_SYN | MPS_K_ACK)) != (MPS_K_MP_JOIN | MPS_K_SYN))
		return 0;
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_JOIN, 12, &len);
	if (!o || len != 12)
		return 0;
	struct mps_event *ev = event_new(MPS_EV_MP_JOIN, pc, &t);
	if (!ev)
		return 1;
	ev->flags = o[2] & 1;
	ev->addr_id = o[3];
	ev->token = load_be32_h(o + 4);
	ev->nonce = load_be32_h(o + 8);
	bpf_ringbuf_submit(ev, 0);
	return 1;
}

/*
 * The window rate_limit advertises on a segment of flow f acknowledging `ack` (window
 * direction d): up to a right edge (kept in the flow entry) that moves at `rate` with time,
 * never more than `most` ahead of the ack (the bucket's depth, abi.h). `asked`: the window the
 * segment carries, in bytes.
 * A window of rate x RTT holds the rate only where it spans several segments: under two the
 * peer waits for delayed ACKs, and the rate it reaches depends on the window's granularity
 * more than on the RTT. An edge that moves with time lets through exactly what the rate
 * allows by now, whatever the RTT: on a short path the peer sends it in bursts, stops at the
 * edge, and goes on at the next ACK or window probe.
 */
static __always_inline __u64 rate_window(struct mps_flow *f, __u32 d, __u32 ack, __u64 rate,
					 __u64 most, __u64 asked)
{
	d &= 1;
	if (most > MPS_RATE_WINDOW_MAX)
		most = MPS_RATE_WINDOW_MAX;
	/* What is left before the edge covers the window asked for already: nothing to lower,
	 * and the edge's growth can wait for a segment that needs it (it is computed from
	 * rate_edge_ns, whenever that comes). The common case of a subflow below its rate costs
	 * no clock read, division or write. */
	__s64 left = (__s32)(f->rate_edge[d] - ack);
	if (f->rate_edge_ns[d] && left >= (__s64)asked && left <= (__s64)most)
		return most;
	__u64 now = bpf_ktime_get_ns();
	__u64 elapsed = now - f->rate_edge_ns[d];
	/* Unset, or idle long enough (a SYN starting the 4-tuple afresh clears it): the subflow
	 * starts with all the credit an idle one keeps. */
	if (!f->rate_edge_ns[d] || elapsed > 2000000000ull) {
		f->rate_edge[d] = ack + most;
		f->rate_edge_ns[d] = now;
		f->rate_most[d] = most;
		return most;
	}
	/* The ack a live subflow sends lies at most the credit of the last update behind the
	 * edge (stored as ack + at most that, and acks only grow): an older one (reordered,
	 * duplicated or forged) changes nothing, and its window the peer ignores anyway. */
	if (left > (__s64)f->rate_most[d])
		return most;
	f->rate_most[d] = most; /* a lower rate (or RTT) caps the credit below */
	/* Growth past 2^31 bytes is capped to `most` (<= 2^30) below anyway; bounding it keeps
	 * rate * elapsed in 64 bits and the edge within a signed 32-bit distance of the ack at
	 * any rate (2^31 bytes take 43 ms at MPS_RATE_MAX, so only a fast subflow's pause
	 * pays the division). */
	if (elapsed > 1000000000ull)
		elapsed = 1000000000ull;
	if (elapsed > (1ull << 31) * 1000000000ull / MPS_RATE_MAX) {
		__u64 span = (1ull << 31) * 1000000000ull / rate;
		if (elapsed > span)
			elapsed = span;
	}
	__u64 grown = rate * elapsed / 1000000000ull;
	if (grown) { /* the remainder stays: the clock moves by what the bytes took */
		f->rate_edge_ns[d] += grown * 1000000000ull / rate;
		if (now - f->rate_edge_ns[d] > 1000000000ull)
			f->rate_edge_ns[d] = now;
	}
	/* Only time moves the edge forward: an ack past it (in flight before the cap applied, or
	 * forged) owes until time catches up, and gets a zero window meanwhile. */
	__s64 ahead = left + (__s64)grown;
	if (ahead > (__s64)most) { /* idle, or a lower rate: no credit beyond `most` */
		f->rate_edge[d] = ack + most;
		return most;
	}
	f->rate_edge[d] += grown;
	return ahead < 0 ? 0 : ahead;
}

/*
 * Lower the advertised receive window so the peer sends at most `rate`: up to the right edge
 * rate_window() keeps (MPS_RATE_BURST_MS in abi.h). The window field is scaled by the shift
 * its sender announced in its SYN; without having seen that SYN the actor does nothing.
 * Never raises a window, never touches a SYN. The options are walked (a malformed packet is
 * never modified) only when a window is to be lowered.
 */
static __always_inline int rate_limit_flow(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					   const struct mps_step *st, struct mps_flow *f,
					   __u8 from_a)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	if (tcp->syn || tcp->rst || !tcp->ack || !f)
		return 0;
	__u32 d = from_a ? 0 : 1;
	/* The shift is in effect only when both SYNs carried the option (RFC 7323): without
	 * the whole negotiation seen, the window's meaning is unknown. */
	if (!f->dir_ab.wscale_known || !f->dir_ba.wscale_known)
		return 0;
	__u32 shift =
	    f->dir_ab.wscale_sent && f->dir_ba.wscale_sent ? MPS_FLOW_DIR(f, d)->wscale : 0;
	__u64 rate = f->rate_bps ? f->rate_bps : st->p.rate.bytes_per_sec;
	__u64 rtt = f->srtt_us ? f->srtt_us : st->p.rate.rtt_us;
	if (!rate || !rtt)
		return 0;
	if (rate < MPS_RATE_MIN)
		rate = MPS_RATE_MIN;
	if (rate > MPS_RATE_MAX)
		rate = MPS_RATE_MAX;
	/* No overflow: rate <= 5e10 and rtt <= 6e7 (a minute, the longest sample taken) give
	 * at most 3e18 < 2^64 (a u32 rtt times the largest rate would not fit). */
	if (rtt > 60000000)
		rtt = 60000000;
	__u64 win = 2 * rate * rtt / 1000000;
	if (win < st->p.rate.min_window)
		win = st->p.rate.min_window;
	if (win < rate * MPS_RATE_BURST_MS / 1000)
		win = rate * MPS_RATE_BURST_MS / 1000;
	__u16 old = bpf_ntohs(tcp->window);
	win = rate_window(f, d, bpf_ntohl(tcp->ack_seq), rate, win, (__u64)old << (shift & 15));
	/* Rounded down to the unit the window is counted in (up to 16 KB): a window rounded up
	 * would let the peer past the edge. Zero too: the peer then probes (after its RTO). */
	win >>= shift & 15;
	if (win >= old)
		return 0;
	if (ensure_scanned(ctx, xdp, pc))
		return -1;
	tcp = view_tcp(ctx, xdp, pc); /* the walk's call leaves packet pointers unknown */
	if (!tcp)
		return -1;
	__be16 oldn = tcp->window, newn = bpf_htons((__u16)win);
	if (xdp) {
		tcp->window = newn;
		csum_replace2(&tcp->check, oldn, newn);
	} else {
		__u32 off = pc->l4_off;
		if (off > 512)
			return -1;
		if (bpf_skb_store_bytes(ctx, off + offsetof(struct tcphdr, window), &newn, 2, 0))
			return -1;
		bpf_l4_csum_replace(ctx, off + offsetof(struct tcphdr, check), oldn, newn, 2);
	}
	return 1;
}

static __always_inline int act_rate_limit(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					  const struct mps_step *st)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	if (tcp->syn || tcp->rst || !tcp->ack) /* before the lookup: nothing to lower */
		return 0;
	__u8 from_a;
	struct mps_flow *f = lookup_flow(ctx, xdp, pc, &from_a);
	return rate_limit_flow(ctx, xdp, pc, st, f, from_a);
}

#endif
