/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Option-rewriting actors (blk_subflow, add_subflow, set_backup, no_subflows, redirect) and
 * reject, which rewrites a SYN into its reset.
 * Included at the end of datapath.bpf.c: uses its maps, context shim, scan() / opt_ptr()
 * and the ACTOR() macro. Each ACTOR(act_<name>, expr) here defines act_<name>_xdp and
 * act_<name>_tc; the loader puts them in the prog-array slot of their enum mps_prog value.
 *
 * Mechanisms (the why is in bpf/ACTORS.md):
 * - blk_subflow invalidates the ADD_ADDR's HMAC (one byte) instead of removing the option:
 *   the receiver drops the announcement silently and still sees an MPTCP option, so a
 *   connection whose first post-handshake option was that ADD_ADDR does not fall back to
 *   TCP (NOPs do make it fall back). The option, HMAC intact, is kept in `announces`.
 * - add_subflow (TC only) turns a copy of the next packet of the flow into a pure ACK that
 *   carries the stored ADD_ADDR (what the kernel itself sends: TS + ADD_ADDR, no DSS), and
 *   hands it to the same hook again with bpf_clone_redirect; ingress copies reach the local
 *   stack, egress copies go to the peer. The original packet is not touched. It does so on
 *   a request from userspace or, with after_bytes, on the first packet of the subflow the
 *   announcement came on once the connection has carried that many bytes (record's count).
 * - set_backup inserts NOP + MP_PRIO (4 bytes) at the end of the TCP header of pure ACKs
 *   only (no payload, no trailer), growing the tail: never a data segment, never GSO. It
 *   also keeps the headers of each subflow direction's latest ACK (prio_tmpl): a subflow B=1
 *   emptied carries no pure ACK any more, so B=0 is sent by userspace from that template
 *   (ActorMaps::signal_prio); Linux applies MP_PRIO only to the subflow it arrives on.
 * - no_subflows sets the MP_CAPABLE C flag of a SYN or SYN/ACK (one byte).
 * - redirect ends the chain with a redirect verdict: TC through bpf_redirect_neigh (L2 from
 *   the neighbour table of the target), XDP after a FIB lookup on the target interface.
 * - reject (TC only) turns a SYN into the reset its destination would answer with and sends
 *   it back where the SYN came from: at tc_egress into this host's own stack (the connect
 *   fails at once instead of retrying a dropped SYN), at tc_ingress out to the sender.
 * Every modification is preceded by an option walk: malformed packets are never modified.
 */
#ifndef MPSTEER_REWRITE_BPF_H
#define MPSTEER_REWRITE_BPF_H

/* ---- state ------------------------------------------------------------------------------ */

/* The shared maps (announces, add_requests, prio_sent) are in state_maps.bpf.h. set_backup's
 * packet templates (struct mps_prio_tmpl, abi.h) live with the loaded datapath: pinned under
 * <pin root>/dp/<object id>/, they survive generations and agent restarts. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, struct mps_prio_tmpl_key);
	__type(value, struct mps_prio_tmpl);
} prio_tmpl SEC(".maps");

#define MPS_AF_INET  2
#define MPS_AF_INET6 10
#define MPC_FLAG_C   0x20 /* MP_CAPABLE flags byte: A B C D E F G H from the high bit */

/* ---- small rewriting helpers ------------------------------------------------------------ */

static __always_inline __u32 frame_len(void *ctx, bool xdp)
{
	if (xdp)
		return ctx_end(ctx, xdp) - ctx_data(ctx, xdp);
	return ((struct __sk_buff *)ctx)->len;
}

static __always_inline __u16 csum_fold32(__u64 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/*
 * Replace the 16-bit word at `woff` bytes into the TCP header (even, inside the header) and
 * fix the TCP checksum: RFC 1624 in XDP (always a complete checksum), bpf_l4_csum_replace in
 * TC (which leaves a CHECKSUM_PARTIAL field alone: the payload sum is computed later).
 * Returns 1 when changed, 0 when the word already had that value, <0 on error.
 */
static __always_inline int tcp_put16(void *ctx, bool xdp, const struct mps_pkt_ctx *pc, __u32 woff,
				     __be16 new)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	woff &= 0x3e;
	__u8 *p = (__u8 *)tcp + woff;
	if ((void *)(p + 2) > ctx_end(ctx, xdp))
		return -1;
	__be16 old;
	__builtin_memcpy(&old, p, 2);
	if (old == new)
		return 0;
	if (xdp) {
		__builtin_memcpy(p, &new, 2);
		csum_replace2(&tcp->check, old, new);
		return 1;
	}
	__u32 l4 = pc->l4_off & 0x1ff;
	if (bpf_skb_store_bytes(ctx, l4 + woff, &new, 2, 0))
		return -1;
	if (bpf_l4_csum_replace(ctx, l4 + offsetof(struct tcphdr, check), old, new, 2))
		return -1;
	return 1;
}

/* One byte of the TCP header: new = ((old & keep) | set) ^ flip. The checksum is fixed on the
 * aligned word holding the byte; a byte at an even offset has its neighbour inside the header
 * too, because TCP header lengths are multiples of 4. */
static __always_inline int tcp_mod8(void *ctx, bool xdp, const struct mps_pkt_ctx *pc, __u32 boff,
				    __u8 keep, __u8 set, __u8 flip)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u32 w = boff & 0x3e;
	__u8 *p = (__u8 *)tcp + w;
	if ((void *)(p + 2) > ctx_end(ctx, xdp))
		return -1;
	/* No b[boff & 1]: clang turns that into a select between two pointers. */
	__u8 b[2] = {p[0], p[1]};
	if (boff & 1)
		b[1] = ((b[1] & keep) | set) ^ flip;
	else
		b[0] = ((b[0] & keep) | set) ^ flip;
	__be16 nw;
	__builtin_memcpy(&nw, b, 2);
	return tcp_put16(ctx, xdp, pc, w, nw);
}

/*
 * Append 4 option bytes to the TCP header of a pure ACK: the frame must end where the TCP
 * header ends (no payload, no Ethernet trailer) and the header must have room (<= 56 bytes).
 * Grows the tail (bpf_xdp_adjust_tail / bpf_skb_change_tail: adjust_room does not move the
 * checksum start in TC), then fixes doff, the IP length and the checksums, the TCP one for
 * the new bytes, the doff word and the pseudo-header length.
 * Returns 1 inserted, 0 not possible here, <0 on error.
 */
static __always_inline int insert_opt4(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
				       const __u8 add[4])
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u32 hlen = tcp->doff * 4;
	__u32 l3 = pc->l3_off & 0x3f, l4 = pc->l4_off & 0x1ff;
	if (hlen + 4 > 60 || pc->l4_len != hlen || frame_len(ctx, xdp) != l4 + hlen)
		return 0;
	__u8 w12[2];
	__builtin_memcpy(w12, (__u8 *)tcp + 12, 2);
	__be16 old_w12, new_w12;
	__builtin_memcpy(&old_w12, w12, 2);
	w12[0] = (w12[0] & 0x0f) | (((hlen + 4) / 4) << 4);
	__builtin_memcpy(&new_w12, w12, 2);
	__be16 old_tl = bpf_htons(pc->l4_len), new_tl = bpf_htons(pc->l4_len + 4);
	__be16 old_ipl, new_ipl;
	__u32 ipl_off = pc->family == 4 ? offsetof(struct iphdr, tot_len)
					: offsetof(struct ipv6hdr, payload_len);
	{
		__u8 *ip = ctx_data(ctx, xdp) + l3;
		if ((void *)(ip + 8) > ctx_end(ctx, xdp))
			return -1;
		__builtin_memcpy(&old_ipl, ip + (ipl_off & 7), 2);
		new_ipl = bpf_htons(bpf_ntohs(old_ipl) + 4);
	}
	__be16 a0, a1;
	__builtin_memcpy(&a0, add, 2);
	__builtin_memcpy(&a1, add + 2, 2);

	if (xdp) {
		if (bpf_xdp_adjust_tail(ctx, 4))
			return 0;
		tcp = view_tcp(ctx, xdp, pc);
		if (!tcp)
			return -1;
		__u8 *p = (__u8 *)tcp + verifier_mask(hlen, 0x3c);
		void *end = ctx_end(ctx, xdp);
		if ((void *)(p + 4) > end)
			return -1;
		__builtin_memcpy(p, add, 4);
		__builtin_memcpy((__u8 *)tcp + 12, &new_w12, 2);
		csum_replace2(&tcp->check, 0, a0);
		csum_replace2(&tcp->check, 0, a1);
		csum_replace2(&tcp->check, old_w12, new_w12);
		csum_replace2(&tcp->check, old_tl, new_tl);
		if (pc->family == 4) {
			struct iphdr *ip = ctx_data(ctx, xdp) + l3;
			if ((void *)(ip + 1) > end)
				return -1;
			ip->tot_len = new_ipl;
			csum_replace2(&ip->check, old_ipl, new_ipl);
		} else {
			struct ipv6hdr *ip6 = ctx_data(ctx, xdp) + l3;
			if ((void *)(ip6 + 1) > end)
				return -1;
			ip6->payload_len = new_ipl;
		}
	} else {
		struct __sk_buff *skb = ctx;
		__u32 csum = l4 + offsetof(struct tcphdr, check);
		__be32 add32;
		__builtin_memcpy(&add32, add, 4);
		if (bpf_skb_change_tail(skb, skb->len + 4, 0))
			return 0;
		if (bpf_skb_store_bytes(skb, l4 + hlen, add, 4, 0) ||
		    bpf_skb_store_bytes(skb, l4 + 12, &new_w12, 2, 0) ||
		    bpf_skb_store_bytes(skb, l3 + ipl_off, &new_ipl, 2, 0))
			return -1;
		if (bpf_l4_csum_replace(skb, csum, 0, add32, 4) ||
		    bpf_l4_csum_replace(skb, csum, old_w12, new_w12, 2) ||
		    bpf_l4_csum_replace(skb, csum, old_tl, new_tl, BPF_F_PSEUDO_HDR | 2))
			return -1;
		if (pc->family == 4 && bpf_l3_csum_replace(skb, l3 + offsetof(struct iphdr, check),
							   old_ipl, new_ipl, 2))
			return -1;
	}
	pc->l4_len += 4;
	return 1;
}

/* ---- blk_subflow ------------------------------------------------------------------------ */

/* Copies the ADD_ADDR the kernel would act on (the last well-formed one: scan()) into a->opt
 * and fills family, address, port. Returns 1, or 0 when there is none (or it is an echo, or a
 * length v1 does not define). The ones before it need no hiding: the kernel overwrites them. */
static __always_inline int read_add_addr(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
					 const struct opt_locs *loc, struct mps_announce *a)
{
	__u32 len;
	__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_ADD, 16, &len);
	if (!o || (o[2] & 1)) /* absent, shorter than any v1 announcement, or E=1 */
		return 0;
	if (len != 16 && len != 18 && len != 28 && len != 30)
		return 0;
	__builtin_memcpy(a->opt, o, 16);
	if (len == 18 || len == 30) {
		o = opt_ptr(ctx, xdp, pc, loc, OPT_ADD, 18, &len);
		if (!o)
			return 0;
		__builtin_memcpy(a->opt + 16, o + 16, 2);
	}
	if (len >= 28) {
		o = opt_ptr(ctx, xdp, pc, loc, OPT_ADD, 28, &len);
		if (!o)
			return 0;
		__builtin_memcpy(a->opt + 16, o + 16, 12);
	}
	if (len == 30) {
		o = opt_ptr(ctx, xdp, pc, loc, OPT_ADD, 30, &len);
		if (!o)
			return 0;
		__builtin_memcpy(a->opt + 28, o + 28, 2);
	}
	a->len = len;
	if (len < 28) {
		a->family = 4;
		__builtin_memcpy(a->addr, a->opt + 4, 4);
		a->port = len == 18 ? (__u16)a->opt[8] << 8 | a->opt[9] : 0;
	} else {
		a->family = 6;
		__builtin_memcpy(a->addr, a->opt + 4, 16);
		a->port = len == 30 ? (__u16)a->opt[20] << 8 | a->opt[21] : 0;
	}
	return 1;
}

static __always_inline int act_blk_subflow(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct opt_locs locs;
	struct mps_announce a = {};
	struct mps_announce_key k = {};
	struct tuple t;

	if (scan(ctx, xdp, pc, &locs))
		return -1;
	if (!(pc->kinds & MPS_K_ADD_ADDR))
		return 0;
	/* The tuple before the option copy: the other way round, clang re-derives the packet
	 * pointer from a 32-bit copy the verifier no longer sees as a pointer. */
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	if (!read_add_addr(ctx, xdp, pc, &locs, &a))
		return 0;
	__u32 off = locs.off[OPT_ADD];
	flow_key(&t, pc->family, &k.flow, &a.from_a);
	k.addr_id = a.opt[3];
	__u64 now = bpf_ktime_get_ns();

	struct mps_announce *e = bpf_map_lookup_elem(&announces, &k);
	if (e) {
		__u32 s = e->state;
		/* Released (or being released): the host is meant to learn it now. */
		if (s == MPS_ANN_INJECTING || s == MPS_ANN_RELEASED)
			return 0;
		/* The id may be re-announced with another address (after REMOVE_ADDR): keep
		 * the latest copy, it is the one add_subflow must deliver. */
		__builtin_memcpy(e->opt, a.opt, sizeof(a.opt));
		__builtin_memcpy(e->addr, a.addr, sizeof(a.addr));
		e->len = a.len;
		e->family = a.family;
		e->port = a.port;
		e->last_ns = now;
		__sync_fetch_and_add(&e->hidden, 1);
	} else {
		a.first_ns = a.last_ns = now;
		a.state = MPS_ANN_BLOCKED;
		a.hidden = 1;
		a.hook = pc->hook;
		struct mps_flow *f = bpf_map_lookup_elem(&flows, &k.flow);
		a.conn_token = f ? f->conn_token : 0;
		/* The map keeps the announcement whatever happens to the event below. */
		if (bpf_map_update_elem(&announces, &k, &a, BPF_NOEXIST) == 0) {
			count_insert(MPS_TI_ANNOUNCES);
			/* add_subflow's after_bytes finds it from the subflow's packets. */
			if (f && k.addr_id < 32)
				__sync_fetch_and_or(&f->hidden_ids, 1u << k.addr_id);
		}
		struct mps_event *ev = event_new(MPS_EV_ADD_ADDR_BLOCKED, pc, &t);
		if (ev) {
			ev->addr_id = k.addr_id;
			ev->flags = a.family;
			ev->nonce = a.port;
			__builtin_memcpy(ev->key, a.addr, 16);
			bpf_ringbuf_submit(ev, 0);
		}
	}
	/* Invalidate the truncated HMAC (the last 8 bytes): flip a whole byte of it, at an even
	 * offset so its checksum word lies inside the option. */
	__u32 b = (off + a.len - 8 + 1) & ~1u;
	int r = tcp_mod8(ctx, xdp, pc, b, 0xff, 0, 0xff);
	return r < 0 ? r : 1;
}

ACTOR(act_blk_subflow, act_blk_subflow(ctx, xdp, &pc))

/* ---- set_backup ------------------------------------------------------------------------- */

/* Keeps the headers of this ACK-bearing packet as its subflow direction's template (see
 * prio_tmpl). Returns <0 only for a packet it cannot read. */
static __always_inline int record_template(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
					   __u16 at)
{
	struct mps_prio_tmpl_key k = {};
	struct tuple t;
	__u8 from_a;

	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u32 hlen = tcp->doff * 4;
	__u32 fin = tcp->fin;
	__u32 len = (pc->l4_off & 0x1ff) + hlen;
	if (len > MPS_PRIO_TMPL_HDR || hlen < 20 || pc->l4_len < hlen)
		return 0; /* e.g. stacked VLANs: no template, the datapath path alone */
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	flow_key(&t, pc->family, &k.flow, &from_a);
	k.dir = from_a ? 0 : 1;
	struct mps_prio_tmpl *v = bpf_map_lookup_elem(&prio_tmpl, &k);
	if (!v) {
		/* Insert, then write in place (no select between a stack and a map pointer). */
		struct mps_prio_tmpl fresh;
		__builtin_memset(&fresh, 0, sizeof(fresh));
		bpf_map_update_elem(&prio_tmpl, &k, &fresh, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&prio_tmpl, &k);
		if (!v)
			return 0;
	}
	/* 1 <= len <= 128 (checked above) as arithmetic the verifier follows: 6.1's narrows only
	 * the register a check ran on, not the copy clang keeps on the stack across the map calls. */
	_Static_assert(MPS_PRIO_TMPL_HDR == 128, "the mask below");
	len = verifier_mask(len - 1, 0x7f) + 1;
	long r =
	    xdp ? bpf_xdp_load_bytes(ctx, 0, v->hdr, len) : bpf_skb_load_bytes(ctx, 0, v->hdr, len);
	if (r)
		return 0;
	v->ns = bpf_ktime_get_ns();
	v->ifindex =
	    xdp ? ((struct xdp_md *)ctx)->ingress_ifindex : ((struct __sk_buff *)ctx)->ifindex;
	v->pc = at;
	v->hook = pc->hook;
	v->family = pc->family;
	v->l3_off = pc->l3_off;
	v->l4_off = pc->l4_off;
	v->len = len;
	v->next = pc->l4_len - hlen + fin;
	return 0;
}

static __always_inline int act_set_backup(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					  const struct mps_step *st)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;

	if (ensure_scanned(ctx, xdp, pc))
		return -1;
	if ((pc->kinds & (MPS_K_SYN | MPS_K_RST | MPS_K_ACK)) == MPS_K_ACK &&
	    record_template(ctx, xdp, pc, pc->pc))
		return -1;
	/* Pure ACKs only: a control packet, never a data segment or a GSO super-packet. */
	if ((pc->kinds & (MPS_K_SYN | MPS_K_FIN | MPS_K_RST | MPS_K_ACK | MPS_K_PAYLOAD)) !=
	    MPS_K_ACK)
		return 0;
	if (pc->kinds & MPS_K_MP_PRIO)
		return 0;
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	flow_key(&t, pc->family, &k, &from_a);
	__u8 bk = st->p.backup.backup ? 1 : 0;
	__u32 d = from_a ? 0 : 1;
	struct mps_prio_sent *ps = bpf_map_lookup_elem(&prio_sent, &k);
	if (ps && !st->p.backup.every_packet && ps->sent[d & 1] == bk + 1)
		return 0;
	__u8 add[4] = {1 /* NOP */, TCPOPT_MPTCP, 3, (OPT_PRIO << 4) | bk};
	int r = insert_opt4(ctx, xdp, pc, add);
	if (r <= 0)
		return r;
	pc->kinds |= MPS_K_MP_PRIO | MPS_K_ANY_MPTCP;
	if (!ps) {
		struct mps_prio_sent z = {};
		bpf_map_update_elem(&prio_sent, &k, &z, BPF_NOEXIST);
		ps = bpf_map_lookup_elem(&prio_sent, &k);
	}
	if (ps) {
		ps->sent[d & 1] = bk + 1;
		ps->ns[d & 1] = bpf_ktime_get_ns();
	}
	return 1;
}

ACTOR(act_set_backup, act_set_backup(ctx, xdp, &pc, st))

/* ---- no_subflows (MP_CAPABLE "C") ------------------------------------------------------- */

static __always_inline int act_no_subflows(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct opt_locs locs;
	__u32 len;

	if (scan(ctx, xdp, pc, &locs))
		return -1;
	if ((pc->kinds & (MPS_K_MP_CAPABLE | MPS_K_SYN)) != (MPS_K_MP_CAPABLE | MPS_K_SYN))
		return 0;
	__u8 *o = opt_ptr(ctx, xdp, pc, &locs, OPT_MPC, 4, &len);
	if (!o || (o[2] & 0x0f) != 1) /* the C flag exists in MPTCP v1 only */
		return 0;
	if (o[3] & MPC_FLAG_C)
		return 0;
	int r = tcp_mod8(ctx, xdp, pc, locs.off[OPT_MPC] + 3, 0xff, MPC_FLAG_C, 0);
	return r < 0 ? r : 1;
}

ACTOR(act_no_subflows, act_no_subflows(ctx, xdp, &pc))

/* ---- add_subflow ------------------------------------------------------------------------ */

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
	__u8 *ts = al <= 28 && locs.off[OPT_TS] ? opt_ptr(skb, false, pc, &locs, OPT_TS, 10, &len)
						 : NULL;
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
XDP_AND_TC(act_add_subflow)

/* ---- reject ----------------------------------------------------------------------------- */

/*
 * Rewrite a SYN (no ACK) in place into the reset its destination answers with when nothing
 * listens (RFC 9293 3.10.7.1): addresses and ports swapped, RST+ACK, seq 0, ack = the SYN's
 * seq + 1 + payload, no options, window 0, a complete TCP checksum. Returns 1 when the packet
 * is that reset; 0 when it is no SYN, or one with IPv4 options or IPv6 extension headers (a
 * reply would have to reverse them); -1 when it cannot be read (untouched); -2 when a rewrite
 * failed half-way.
 */
static __always_inline int make_reset(struct __sk_buff *skb, const struct mps_pkt_ctx *pc)
{
	struct tuple t;
	if (load_tuple(skb, false, pc, &t))
		return -1;
	struct tcphdr *tcp = view_tcp(skb, false, pc);
	if (!tcp)
		return -1;
	if (!tcp->syn || tcp->ack || tcp->rst)
		return 0;
	__u32 l3 = pc->l3_off & 0x3f, l4 = pc->l4_off & 0x1ff;
	if (l4 - l3 != (pc->family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)))
		return 0;
	struct tcphdr rst = {};
	rst.source = tcp->dest;
	rst.dest = tcp->source;
	rst.ack_seq = bpf_htonl(bpf_ntohl(tcp->seq) + 1 + (pc->l4_len - tcp->doff * 4));
	rst.doff = 5;
	rst.rst = 1;
	rst.ack = 1;

	__u32 ps[10] = {};
	__s64 sum;
	__u8 eth[12], swapped[12];
	if (bpf_skb_load_bytes(skb, 0, eth, 12))
		return -1;
	__builtin_memcpy(swapped, eth + 6, 6);
	__builtin_memcpy(swapped + 6, eth, 6);
	__be16 old_len, new_len;
	if (pc->family == 4) {
		ps[0] = t.dst[0];
		ps[1] = t.src[0];
		ps[2] = bpf_htonl(IPPROTO_TCP << 16 | sizeof(rst));
		sum = bpf_csum_diff(NULL, 0, ps, 12, 0);
		if (bpf_skb_load_bytes(skb, l3 + offsetof(struct iphdr, tot_len), &old_len, 2))
			return -1;
		new_len = bpf_htons(l4 - l3 + sizeof(rst));
	} else {
		__builtin_memcpy(ps, t.dst, 16);
		__builtin_memcpy(ps + 4, t.src, 16);
		ps[8] = bpf_htonl(sizeof(rst));
		ps[9] = bpf_htonl(IPPROTO_TCP);
		sum = bpf_csum_diff(NULL, 0, ps, 40, 0);
		new_len = bpf_htons(l4 - l3 - sizeof(struct ipv6hdr) + sizeof(rst));
	}
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&rst, sizeof(rst), (__u32)sum);
	if (sum < 0)
		return -1;
	rst.check = ~csum_fold32((__u64)sum);

	if (bpf_skb_change_tail(skb, l4 + sizeof(rst), 0))
		return -1;
	if (bpf_skb_store_bytes(skb, 0, swapped, 12, 0) ||
	    bpf_skb_store_bytes(skb, l4, &rst, sizeof(rst), BPF_F_RECOMPUTE_CSUM))
		return -2;
	/* Swapping the addresses leaves the IPv4 header checksum as it is (same words). */
	if (pc->family == 4) {
		if (bpf_skb_store_bytes(skb, l3 + offsetof(struct iphdr, saddr), ps, 8,
					BPF_F_RECOMPUTE_CSUM) ||
		    bpf_skb_store_bytes(skb, l3 + offsetof(struct iphdr, tot_len), &new_len, 2,
					BPF_F_RECOMPUTE_CSUM) ||
		    bpf_l3_csum_replace(skb, l3 + offsetof(struct iphdr, check), old_len, new_len, 2))
			return -2;
	} else if (bpf_skb_store_bytes(skb, l3 + offsetof(struct ipv6hdr, saddr), ps, 32,
				       BPF_F_RECOMPUTE_CSUM) ||
		   bpf_skb_store_bytes(skb, l3 + offsetof(struct ipv6hdr, payload_len), &new_len, 2,
				       BPF_F_RECOMPUTE_CSUM)) {
		return -2;
	}
	return 1;
}

/* The chain ends here: a SYN goes back as its reset (tc_egress: into this host's stack;
 * tc_ingress: out to the sender), anything else is dropped. A packet it cannot read is
 * unparseable (passed untouched unless guarded), like every actor's. XDP drops (the manifest
 * allows reject at TC only). */
static __always_inline int act_reject_body(void *ctx, bool xdp)
{
	struct mps_pkt_ctx pc;
	if (pctx_load(ctx, xdp, &pc))
		return PASS(xdp);
	int r = xdp ? 0 : make_reset(ctx, &pc);
	if (r < 0)
		gen_count(&pc, MPS_GC_MALFORMED);
	if (r == -1)
		return unparseable(ctx_slot(&pc), pc.pc, xdp);
	step_count(&pc, pc.pc, true, true);
	if (r > 0)
		return bpf_redirect(((struct __sk_buff *)ctx)->ifindex,
				    pc.hook == MPS_HOOK_TC_EGRESS ? BPF_F_INGRESS : 0);
	return DROP(xdp);
}
XDP_AND_TC(act_reject)

/* ---- redirect --------------------------------------------------------------------------- */

/* XDP: forward like the kernel would out of `ifindex`: FIB lookup from the egress side
 * (routes through that interface only), MACs from its neighbour entry, TTL / hop limit
 * decremented. Returns 1 when the frame is ready to go, 0 to leave it to the stack. */
static __always_inline int xdp_prepare_redirect(struct xdp_md *ctx, const struct mps_pkt_ctx *pc,
						__u32 ifindex)
{
	struct bpf_fib_lookup fib = {};
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u32 l3 = pc->l3_off & 0x3f;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return 0;
	if (pc->family == 4) {
		struct iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end || ip->ttl <= 1)
			return 0;
		fib.family = MPS_AF_INET;
		fib.tos = ip->tos;
		fib.l4_protocol = IPPROTO_TCP;
		fib.tot_len = bpf_ntohs(ip->tot_len);
		fib.ipv4_src = ip->saddr;
		fib.ipv4_dst = ip->daddr;
	} else {
		struct ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end || ip6->hop_limit <= 1)
			return 0;
		fib.family = MPS_AF_INET6;
		fib.l4_protocol = IPPROTO_TCP;
		fib.tot_len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
		__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
	}
	fib.ifindex = ifindex;
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT) !=
		BPF_FIB_LKUP_RET_SUCCESS ||
	    fib.ifindex != ifindex)
		return 0;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return 0;
	if (pc->family == 4) {
		struct iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return 0;
		__be16 old, new;
		__builtin_memcpy(&old, &ip->ttl, 2);
		ip->ttl--;
		__builtin_memcpy(&new, &ip->ttl, 2);
		csum_replace2(&ip->check, old, new);
	} else {
		struct ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return 0;
		ip6->hop_limit--;
	}
	__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);
	return 1;
}

/* A redirect ends the chain: later steps do not run for a redirected packet. */
static __always_inline int act_redirect_body(void *ctx, bool xdp)
{
	struct mps_pkt_ctx pc;
	if (pctx_load(ctx, xdp, &pc))
		return PASS(xdp);
	const struct mps_step *st = load_step(&pc);
	__u32 at = pc.pc;
	__u32 ifindex = st->p.redirect.ifindex;
	if (ifindex) {
		if (!xdp) {
			struct __sk_buff *skb = ctx;
			step_count(&pc, at, true, false);
			/* Already leaving by the target (a packet this or another policy redirected
			 * here meets the target's egress chain): sending it there again would loop
			 * until the kernel's recursion limit drops it. */
			if (pc.hook == MPS_HOOK_TC_EGRESS && skb->ifindex == ifindex)
				return TC_ACT_OK;
			return bpf_redirect_neigh(ifindex, NULL, 0, 0);
		}
		if (xdp_prepare_redirect(ctx, &pc, ifindex)) {
			step_count(&pc, at, true, false);
			return bpf_redirect(ifindex, 0);
		}
	}
	step_count(&pc, at, false, false);
	return step_next(ctx, xdp, &pc, at, st->flags, st->on_match);
}
XDP_AND_TC(act_redirect)

#endif
