/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What the option-rewriting actors share: set_backup's templates, checksum folding, in-place
 * writes to the TCP header and option insertion. Each actor is a header of its own
 * (blk_subflow.h, set_backup.h, no_subflows.h, add_subflow.h, reject.h, redirect.h).
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
#ifndef MPSTEER_LIB_REWRITE_H
#define MPSTEER_LIB_REWRITE_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "shim.h"
#include "packet.h"
#include "options.h"
#include "syn_reset.h"

/* ---- state ------------------------------------------------------------------------------ */

/* The shared maps (announces, add_requests, prio_sent) are in state_maps.h. set_backup's
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

#endif
