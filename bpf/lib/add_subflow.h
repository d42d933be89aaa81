/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * add_subflow (TC only): a stored ADD_ADDR re-injected in a pure ACK cloned from the flow.
 */
#ifndef MPSTEER_LIB_ADD_SUBFLOW_H
#define MPSTEER_LIB_ADD_SUBFLOW_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "packet.h"
#include "options.h"
#include "rewrite.h"
#include "flow.h"
#include "steps.h"

/* The lowest bit set in a non-zero mask (BPF has no count-trailing-zeros instruction). */
static __always_inline __u8 lowest_bit(__u32 m)
{
	__u8 n = 0;
	if (!(m & 0xffff)) {
		n += 16;
		m >>= 16;
	}
	if (!(m & 0xff)) {
		n += 8;
		m >>= 8;
	}
	if (!(m & 0xf)) {
		n += 4;
		m >>= 4;
	}
	if (!(m & 0x3)) {
		n += 2;
		m >>= 2;
	}
	if (!(m & 0x1))
		n += 1;
	return n;
}

/* The announcement is no longer hidden (released, or gone from the LRU): after_bytes stops
 * looking for it on its subflow. */
static __always_inline void forget_hidden(const struct mps_flow_key *flow, __u8 addr_id)
{
	struct mps_flow *f = bpf_map_lookup_elem(&flows, flow);
	if (f && addr_id < 32)
		__sync_fetch_and_and(&f->hidden_ids, ~(1u << addr_id));
}

/*
 * Pass 1 (TC, a packet in the announcement's direction): clone the packet, marked as a copy,
 * back into this hook; the packet itself goes on. Which announcement: the one userspace
 * requested on this flow (state PENDING), else with after_bytes the lowest id blk_subflow hid
 * on this subflow (state BLOCKED) once the connection has carried after_bytes, counting this
 * packet (record at XDP ran before).
 */
static __always_inline int add_subflow_trigger(struct __sk_buff *skb, struct mps_pkt_ctx *pc,
					       const struct mps_step *st)
{
	struct mps_announce_key k = {};
	struct tuple t;
	__u8 from_a;

	if (ensure_scanned(skb, false, pc))
		return -1;
	if ((pc->kinds & (MPS_K_SYN | MPS_K_FIN | MPS_K_RST | MPS_K_ACK)) != MPS_K_ACK)
		return 0;
	if (load_tuple(skb, false, pc, &t))
		return -1;
	flow_key(&t, pc->family, &k.flow, &from_a);
	struct mps_add_request *rq = bpf_map_lookup_elem(&add_requests, &k.flow);
	__u32 waiting = MPS_ANN_PENDING;
	if (rq) {
		k.addr_id = rq->addr_id;
	} else {
		if (!st->p.add.on_bytes)
			return 0;
		struct mps_flow *f = bpf_map_lookup_elem(&flows, &k.flow);
		if (!f || !f->hidden_ids || bytes_seen(f, true) < st->p.add.after_bytes)
			return 0;
		k.addr_id = lowest_bit(f->hidden_ids);
		waiting = MPS_ANN_BLOCKED;
	}
	struct mps_announce *a = bpf_map_lookup_elem(&announces, &k);
	if (!a || a->state == MPS_ANN_RELEASED) {
		if (rq)
			bpf_map_delete_elem(&add_requests, &k.flow);
		else
			forget_hidden(&k.flow, k.addr_id);
		return 0;
	}
	if (a->from_a != from_a) /* the carrier travels the way the announcement did */
		return 0;
	if (!__sync_bool_compare_and_swap(&a->state, waiting, MPS_ANN_INJECTING))
		return 0;
	__u32 mark = skb->mark;
	skb->mark = MPS_MARK_COPY | k.addr_id;
	long r = bpf_clone_redirect(skb, skb->ifindex,
				    pc->hook == MPS_HOOK_TC_INGRESS ? BPF_F_INGRESS : 0);
	skb->mark = mark;
	if (r) {
		a->state = waiting; /* try again on the next packet */
		return 0;
	}
	if (rq)
		bpf_map_delete_elem(&add_requests, &k.flow);
	return 1;
}

#ifndef MPS_NO_KERNEL_BTF
/* The subflow socket, read through BTF (CO-RE): only the fields used here. */
struct tcp_sock {
	__u32 rcv_nxt;
	__u32 rcv_wup;
	__u32 rcv_wnd;
} __attribute__((preserve_access_index));
#endif

/* How far ahead of the packet's sequence a pure ACK on its subflow stays acceptable to the
 * local socket: the right edge (rcv_wup + rcv_wnd) of the window it advertised. A kernel
 * without BTF cannot read those fields; there it is a little ahead of rcv_nxt (struct
 * bpf_tcp_sock). Returns 1, or 0 when there is no such socket (e.g. a BPF_PROG_TEST_RUN). */
static __always_inline int rcv_window_edge(struct __sk_buff *skb, const struct tuple *t,
					   __u8 family, __u32 *edge)
{
	struct bpf_sock_tuple st = {};
	struct bpf_sock *sk;

	if (family == 4) {
		st.ipv4.saddr = t->src[0];
		st.ipv4.daddr = t->dst[0];
		st.ipv4.sport = bpf_htons(t->sport);
		st.ipv4.dport = bpf_htons(t->dport);
		sk = bpf_skc_lookup_tcp(skb, &st, sizeof(st.ipv4), BPF_F_CURRENT_NETNS, 0);
	} else {
		__builtin_memcpy(st.ipv6.saddr, t->src, 16);
		__builtin_memcpy(st.ipv6.daddr, t->dst, 16);
		st.ipv6.sport = bpf_htons(t->sport);
		st.ipv6.dport = bpf_htons(t->dport);
		sk = bpf_skc_lookup_tcp(skb, &st, sizeof(st.ipv6), BPF_F_CURRENT_NETNS, 0);
	}
	if (!sk)
		return 0;
	int found = 0;
#ifndef MPS_NO_KERNEL_BTF
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (tp) {
		*edge = tp->rcv_wup + tp->rcv_wnd;
		found = 1;
	}
#else
	/* rcv_nxt moves on while the carrier waits in the backlog behind segments still arriving,
	 * and once the socket acknowledges them, a carrier at the old rcv_nxt is an old sequence.
	 * Eight segments ahead stays inside any window a receiving socket advertises (its first
	 * one is about ten) and ahead of what arrives meanwhile. */
	struct bpf_tcp_sock *tp = bpf_tcp_sock(sk);
	if (tp) {
		*edge = tp->rcv_nxt + 8 * tp->mss_cache;
		found = 1;
	}
#endif
	bpf_sk_release(sk);
	return found;
}

/*
 * Pass 2 (the marked copy): rewrite it into a pure ACK following the original on the same
 * subflow (seq = original seq + payload, or the right edge of the socket's receive window when
 * that is ahead; same ack, window and timestamps) whose options are
 * the timestamps and the stored ADD_ADDR, then send that back through the hook once more
 * (pass 3 passes it, so packet taps on the interface see the carrier as the stack gets it).
 * The checksum is computed afresh; a copy still in CHECKSUM_PARTIAL (TC egress: the field
 * holds the pseudo-header sum) gets the new pseudo-header sum instead.
 */
static __always_inline int make_carrier(struct __sk_buff *skb, struct mps_pkt_ctx *pc, __u8 addr_id)
{
	struct mps_announce_key k = {};
	struct opt_locs locs;
	struct tuple t;
	__u8 from_a, hdr[64] = {};
	__u32 len;

	if (scan(skb, false, pc, &locs))
		return -1;
	if (load_tuple(skb, false, pc, &t))
		return -1;
	flow_key(&t, pc->family, &k.flow, &from_a);
	k.addr_id = addr_id;
	struct mps_announce *a = bpf_map_lookup_elem(&announces, &k);
	if (!a || a->state != MPS_ANN_INJECTING)
		return 0;
	struct tcphdr *tcp = view_tcp(skb, false, pc);
	if (!tcp)
		return -1;
	__u32 hlen = tcp->doff * 4;
	__u32 payload = pc->l4_len - hlen;
	__be16 old_check = tcp->check;
	__builtin_memcpy(hdr, tcp, 20);
	/* The copy comes out of the backlog after the segments the stack took meanwhile; once
	 * those are acknowledged, a carrier at the end of the original is an old sequence that TCP
	 * drops before MPTCP reads its options. The right edge of the window the socket advertised
	 * stays acceptable (it never moves back, and a pure ACK there is in the window): use it
	 * when it is ahead. */
	__u32 next = bpf_ntohl(tcp->seq) + payload, edge;
	if (rcv_window_edge(skb, &t, pc->family, &edge) && (__s32)(edge - next) > 0)
		next = edge;
	__be32 seq = bpf_htonl(next);
	__builtin_memcpy(hdr + 4, &seq, 4);
	hdr[13] = 0x10; /* ACK only */
	hdr[16] = hdr[17] = hdr[18] = hdr[19] = 0;

	__u32 alen = a->len, base, newh;
	__u32 al = (alen + 3) & ~3u;
	/* Copied straight from the packet: a staging buffer would overrun the stack's budget. */
	__u8 *ts =
	    al <= 28 && locs.off[OPT_TS] ? opt_ptr(skb, false, pc, &locs, OPT_TS, 10, &len) : NULL;
	if (ts) {
		hdr[20] = hdr[21] = 1;
		__builtin_memcpy(hdr + 22, ts, 10);
		__builtin_memcpy(hdr + 32, a->opt, 28);
		base = 32;
	} else { /* IPv6 with a port (32 bytes) leaves no room for the timestamps */
		__builtin_memcpy(hdr + 20, a->opt, 32);
		base = 20;
	}
	/* NOPs after an 18- or 30-byte option (constant indices for the verifier). */
	if (base == 32 && alen == 18) {
		hdr[50] = hdr[51] = 1;
	} else if (base == 20) {
		if (alen == 18)
			hdr[38] = hdr[39] = 1;
		else if (alen == 30)
			hdr[50] = hdr[51] = 1;
	}
	newh = (base + al) & 0x3c;
	if (newh < 36)
		return 0;
	hdr[12] = (newh / 4) << 4;

	/* Pseudo-header sums for the old and the new TCP length. */
	__u32 l3 = pc->l3_off & 0x3f, l4 = pc->l4_off & 0x1ff;
	__u32 ps[10] = {};
	__u32 plen;
	__u64 s_old, s_new;
	if (pc->family == 4) {
		ps[0] = t.src[0];
		ps[1] = t.dst[0];
		ps[2] = bpf_htonl(IPPROTO_TCP << 16 | pc->l4_len);
		plen = 12;
		s_old = bpf_csum_diff(NULL, 0, ps, 12, 0);
		ps[2] = bpf_htonl(IPPROTO_TCP << 16 | newh);
		s_new = bpf_csum_diff(NULL, 0, ps, 12, 0);
	} else {
		__builtin_memcpy(ps, t.src, 16);
		__builtin_memcpy(ps + 4, t.dst, 16);
		ps[8] = bpf_htonl(pc->l4_len);
		ps[9] = bpf_htonl(IPPROTO_TCP);
		plen = 40;
		s_old = bpf_csum_diff(NULL, 0, ps, 40, 0);
		ps[8] = bpf_htonl(newh);
		s_new = bpf_csum_diff(NULL, 0, ps, 40, 0);
	}
	(void)plen;
	__be16 check;
	if (old_check == csum_fold32(s_old)) {
		check = csum_fold32(s_new); /* CHECKSUM_PARTIAL: the stack adds the rest */
	} else {
		__s64 s = bpf_csum_diff(NULL, 0, (__be32 *)hdr, newh, (__u32)s_new);
		if (s < 0)
			return -1;
		check = ~csum_fold32((__u64)s);
	}
	__builtin_memcpy(hdr + 16, &check, 2);

	/* The IP length. */
	__be16 old_ipl, new_ipl;
	__u32 ipl_off;
	{
		__u8 *ip = ctx_data(skb, false) + l3;
		if ((void *)(ip + 8) > ctx_end(skb, false))
			return -1;
		if (pc->family == 4) {
			ipl_off = offsetof(struct iphdr, tot_len);
			__builtin_memcpy(&old_ipl, ip + 2, 2);
			new_ipl = bpf_htons(l4 - l3 + newh);
		} else {
			ipl_off = offsetof(struct ipv6hdr, payload_len);
			__builtin_memcpy(&old_ipl, ip + 4, 2);
			new_ipl = bpf_htons(l4 - l3 - sizeof(struct ipv6hdr) + newh);
		}
	}
	if (bpf_skb_change_tail(skb, l4 + newh, 0))
		return -1;
	if (bpf_skb_store_bytes(skb, l4, hdr, newh, BPF_F_RECOMPUTE_CSUM))
		return -1;
	/* Length and IP checksum change together: their sum, hence skb->csum, is unchanged. */
	if (bpf_skb_store_bytes(skb, l3 + ipl_off, &new_ipl, 2, 0))
		return -1;
	if (pc->family == 4 &&
	    bpf_l3_csum_replace(skb, l3 + offsetof(struct iphdr, check), old_ipl, new_ipl, 2))
		return -1;

	skb->mark = MPS_MARK_CARRIER | addr_id;
	long r = bpf_clone_redirect(skb, skb->ifindex,
				    pc->hook == MPS_HOOK_TC_INGRESS ? BPF_F_INGRESS : 0);
	if (r) {
		a->state = MPS_ANN_PENDING;
		struct mps_add_request rq = {.addr_id = addr_id,
					     .requested_ns = bpf_ktime_get_ns()};
		bpf_map_update_elem(&add_requests, &k.flow, &rq, BPF_ANY);
		return 0;
	}
	a->released_ns = bpf_ktime_get_ns();
	a->state = MPS_ANN_RELEASED;
	forget_hidden(&k.flow, addr_id);
	return 1;
}

/* By hand rather than ACTOR(): the copy ends here (dropped after its carrier is sent) and the
 * carrier passes without running the rest of the chain. XDP cannot clone: there the actor
 * does nothing and the chain goes on (place add_subflow on tc_ingress / tc_egress). */
static __always_inline int act_add_subflow_body(void *ctx, bool xdp)
{
	struct mps_pkt_ctx pc;
	if (pctx_load(ctx, xdp, &pc))
		return PASS(xdp);
	const struct mps_step *st = load_step(&pc);
	__u32 at = pc.pc;
	int r = 0;
	if (!xdp) {
		struct __sk_buff *skb = ctx;
		__u32 mark = skb->mark;
		if ((mark & MPS_MARK_MASK) == MPS_MARK_CARRIER) {
			skb->mark = 0;
			return PASS(xdp);
		}
		if ((mark & MPS_MARK_MASK) == MPS_MARK_COPY) {
			r = make_carrier(skb, &pc, mark & 0xff);
			if (r < 0)
				gen_count(&pc, MPS_GC_MALFORMED);
			step_count(&pc, at, r > 0, true);
			return TC_ACT_SHOT;
		}
		r = add_subflow_trigger(skb, &pc, st);
		if (r < 0)
			return step_malformed(&pc, xdp);
	}
	step_count(&pc, at, r > 0, false); /* applied: this packet triggered the carrier */
	return step_next(ctx, xdp, &pc, at, st->flags, st->on_match);
}

#endif
