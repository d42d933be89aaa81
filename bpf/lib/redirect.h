/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * redirect: the packet out of another interface (TC: bpf_redirect_neigh; XDP: a FIB lookup).
 */
#ifndef MPSTEER_LIB_REDIRECT_H
#define MPSTEER_LIB_REDIRECT_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "packet.h"
#include "options.h"
#include "rewrite.h"
#include "steps.h"

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

#endif
