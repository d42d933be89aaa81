/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A packet as the steps see it: its TCP header re-derived from the context's offsets, its
 * addresses and ports (struct tuple), and the flow key both directions share.
 */
#ifndef MPSTEER_LIB_PACKET_H
#define MPSTEER_LIB_PACKET_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "shim.h"

/* The TCP header of the packet described by pc, re-derived from the offsets. */
static __always_inline struct tcphdr *view_tcp(void *ctx, bool xdp, const struct mps_pkt_ctx *pc)
{
	/* A mask, not a comparison: clang merges repeated bounds checks on the same field and
	 * forms data + off from a copy the verifier never saw bounded. The entry program only
	 * accepts l4_off < 512, so the mask never changes the value. */
	__u32 off = pc->l4_off;
	barrier_var(off);
	off &= 0x1ff;
	void *end = ctx_end(ctx, xdp);
	struct tcphdr *tcp = ctx_data(ctx, xdp) + off;
	if ((void *)(tcp + 1) > end)
		return NULL;
	return tcp;
}

/* Source and destination addresses (network order) and ports (host order). */
struct tuple {
	__u32 src[4], dst[4];
	__u16 sport, dport;
};

static __always_inline int load_tuple(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
				      struct tuple *t)
{
	void *data = ctx_data(ctx, xdp), *end = ctx_end(ctx, xdp);
	__u32 l3 = pc->l3_off; /* < 64, see view_tcp() */
	barrier_var(l3);
	l3 &= 0x3f;
	if (pc->family == 4) {
		struct iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return -1;
		t->src[0] = ip->saddr;
		t->dst[0] = ip->daddr;
		t->src[1] = t->src[2] = t->src[3] = 0;
		t->dst[1] = t->dst[2] = t->dst[3] = 0;
	} else {
		struct ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return -1;
		__builtin_memcpy(t->src, &ip6->saddr, 16);
		__builtin_memcpy(t->dst, &ip6->daddr, 16);
	}
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	t->sport = bpf_ntohs(tcp->source);
	t->dport = bpf_ntohs(tcp->dest);
	return 0;
}

/* Compare (address, port) endpoints in network byte order as byte strings. */
static __always_inline int endpoint_cmp(const __u32 *x, __u16 xp, const __u32 *y, __u16 yp)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 a = bpf_ntohl(x[i]), b = bpf_ntohl(y[i]);
		if (a != b)
			return a < b ? -1 : 1;
	}
	return xp == yp ? 0 : (xp < yp ? -1 : 1);
}

/* The flow key puts the lower endpoint first; *from_a says whether the packet left a. */
static __always_inline void flow_key(const struct tuple *t, __u8 family, struct mps_flow_key *k,
				     __u8 *from_a)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = family;
	if (endpoint_cmp(t->src, t->sport, t->dst, t->dport) <= 0) {
		__builtin_memcpy(k->a, t->src, 16);
		__builtin_memcpy(k->b, t->dst, 16);
		k->port_a = t->sport;
		k->port_b = t->dport;
		*from_a = 1;
	} else {
		__builtin_memcpy(k->a, t->dst, 16);
		__builtin_memcpy(k->b, t->src, 16);
		k->port_a = t->dport;
		k->port_b = t->sport;
		*from_a = 0;
	}
}

/* Incremental checksum update (RFC 1624) of a 16-bit field, for XDP where the TCP checksum
 * is always complete. */
static __always_inline void csum_replace2(__sum16 *sum, __be16 old, __be16 new)
{
	__u32 c = (__u16) ~*sum;
	c += (__u16)~old;
	c += new;
	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	*sum = ~c;
}

#endif
