/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * reject (TC only): a SYN turned into the reset its destination would answer, sent back.
 */
#ifndef MPSTEER_LIB_REJECT_H
#define MPSTEER_LIB_REJECT_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/pkt_cls.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "packet.h"
#include "options.h"
#include "rewrite.h"
#include "syn_reset.h"
#include "steps.h"

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
	struct tcphdr rst;
	__u32 ps[10] = {};
	__u8 eth[12], swapped[12];
	if (bpf_skb_load_bytes(skb, 0, eth, 12))
		return -1;
	__builtin_memcpy(swapped, eth + 6, 6);
	__builtin_memcpy(swapped + 6, eth, 6);
	__be16 old_len, new_len;
	if (pc->family == 4) {
		if (bpf_skb_load_bytes(skb, l3 + offsetof(struct iphdr, tot_len), &old_len, 2))
			return -1;
		new_len = bpf_htons(l4 - l3 + sizeof(rst));
	} else {
		new_len = bpf_htons(l4 - l3 - sizeof(struct ipv6hdr) + sizeof(rst));
	}
	if (syn_reset(tcp, pc->l4_len - tcp->doff * 4, pc->family, t.src, t.dst, &rst, ps))
		return -1;

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
		    bpf_l3_csum_replace(skb, l3 + offsetof(struct iphdr, check), old_len, new_len,
					2))
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

#endif
