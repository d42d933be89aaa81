/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The selectors: the inline one (every cheap selector, lowered to tests on a tuple of the
 * packet's words), and those with a program of their own (token, sequence, flow_bytes) on
 * flow state.
 */
#ifndef MPSTEER_LIB_SELECTORS_H
#define MPSTEER_LIB_SELECTORS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "chain_maps.h"
#include "packet.h"
#include "options.h"
#include "flow.h"

/* ---- selectors -------------------------------------------------------------------------- */

/* A selector answers 1 (match), 0 (miss) or -1 (malformed: pass the packet untouched). */

/*
 * The inline selector (struct mps_p_match in abi.h), written branch-free over the packet's
 * match tuple, built once per chain: the interpreter loop is verified once per iteration, so
 * every branch in here would be paid 32 times over by the verifier.
 */
struct match_tuple {
	__u32 w[MPS_W_MAX]; /* enum mps_word; MPS_W_IP once a step asked for it */
	__u32 family_bit;   /* MPS_FAMILY_* of the packet */
	__u32 have_ip;
};

static __always_inline int load_match_tuple(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
					    struct match_tuple *mt)
{
	void *data = ctx_data(ctx, xdp), *end = ctx_end(ctx, xdp);
	__u32 *w = mt->w;
	__u32 l3 = pc->l3_off; /* < 64, see view_tcp() */
	barrier_var(l3);
	l3 &= 0x3f;
	if (pc->family == 4) {
		struct iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return -1;
		w[MPS_W_SRC] = ip->saddr;
		w[MPS_W_DST] = ip->daddr;
		w[MPS_W_SRC + 1] = w[MPS_W_SRC + 2] = w[MPS_W_SRC + 3] = 0;
		w[MPS_W_DST + 1] = w[MPS_W_DST + 2] = w[MPS_W_DST + 3] = 0;
		mt->family_bit = MPS_FAMILY_V4;
	} else {
		struct ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return -1;
		__builtin_memcpy(&w[MPS_W_SRC], &ip6->saddr, 16);
		__builtin_memcpy(&w[MPS_W_DST], &ip6->daddr, 16);
		mt->family_bit = MPS_FAMILY_V6;
	}
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u32 sp = bpf_ntohs(tcp->source), dp = bpf_ntohs(tcp->dest);
	w[MPS_W_SPORT] = sp;
	w[MPS_W_DPORT] = dp;
	w[MPS_W_PORTS] = sp << 16 | dp;
	w[MPS_W_PORTS_REV] = dp << 16 | sp;
	w[MPS_W_KINDS] = w[MPS_W_KINDS ^ MPS_W_SWAP] = pc->kinds; /* again once the walk ran */
	mt->have_ip = 0;
	return 0;
}

/* The IP word, read when a step first asks for it: TOS (traffic class) << 8 | TTL (hop limit). */
static __always_inline int load_match_ip(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
					 struct match_tuple *mt)
{
	void *data = ctx_data(ctx, xdp), *end = ctx_end(ctx, xdp);
	__u32 l3 = pc->l3_off; /* < 64, see view_tcp() */
	barrier_var(l3);
	l3 &= 0x3f;
	const __u8 *b = data + l3;
	if ((void *)(b + 9) > end)
		return -1;
	__u32 v = pc->family == 4 ? (__u32)b[1] << 8 | b[8]
				  : (__u32)((b[0] & 0x0f) << 4 | b[1] >> 4) << 8 | b[7];
	mt->w[MPS_W_IP] = mt->w[MPS_W_IP ^ MPS_W_SWAP] = v;
	mt->have_ip = 1;
	return 0;
}

/* Every test of p on the tuple, its words read as word ^ swap. Unrolled by hand: the
 * compiler will not unroll it inside the interpreter's loop, and a loop of its own costs a
 * counter and a pointer per test. */
static __always_inline __u64 m_tests(const struct match_tuple *mt, const struct mps_p_match *p,
				     __u32 swap)
{
	__u64 ok = 1;
	__u32 n = p->n;
#define MPS_MATCH_TEST(i)                                                                          \
	if (n <= i)                                                                                \
		return ok;                                                                         \
	ok &= in_range(mt->w[(p->word[i] ^ swap) & (MPS_W_MAX - 1)] & p->mask[i], p->lo[i],        \
		       p->hi[i]);
	MPS_MATCH_TEST(0)
	MPS_MATCH_TEST(1)
	MPS_MATCH_TEST(2)
	MPS_MATCH_TEST(3)
	MPS_MATCH_TEST(4)
	MPS_MATCH_TEST(5)
	MPS_MATCH_TEST(6)
	MPS_MATCH_TEST(7)
	MPS_MATCH_TEST(8)
#undef MPS_MATCH_TEST
	return ok;
}

static __always_inline __u64 m_match(const struct match_tuple *mt, const struct mps_p_match *p)
{
	/* Held in a register: left to itself the compiler rebuilds p's address for every test. */
	barrier_var(p);
	__u64 m = m_tests(mt, p, 0);
	/* The other way round only when this way missed. */
	if (!m && (p->flags & MPS_MATCHF_EITHER)) {
		barrier_var(p); /* read again: kept from the first pass, they would be spilt */
		m = m_tests(mt, p, MPS_W_SWAP);
	}
	return m & (p->families & mt->family_bit ? 1 : 0);
}

static __always_inline struct mps_flow *lookup_flow(void *ctx, bool xdp,
						    const struct mps_pkt_ctx *pc, __u8 *from_a)
{
	struct tuple t;
	struct mps_flow_key k;
	if (load_tuple(ctx, xdp, pc, &t))
		return NULL;
	flow_key(&t, pc->family, &k, from_a);
	return bpf_map_lookup_elem(&flows, &k);
}

static __always_inline int sel_token(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
				     const struct mps_step *st)
{
	__u8 from_a;
	struct mps_flow *f = lookup_flow(ctx, xdp, pc, &from_a);
	__u32 tok = st->p.token.token;
	return f && tok && (f->token[0] == tok || f->token[1] == tok);
}

static __always_inline int sel_sequence(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					const struct mps_step *st)
{
	const struct mps_p_seq *p = &st->p.seq;
	__u8 from_a;
	struct mps_flow *f = lookup_flow(ctx, xdp, pc, &from_a);
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	if (!f)
		return 0;
	__u32 d = from_a ? 0 : 1;
	__u64 rel;
	if (p->kind == MPS_SEQ_SUBFLOW) {
		if (!MPS_FLOW_DIR(f, d)->wscale_known) /* ISN not seen */
			return 0;
		rel = (__u32)(bpf_ntohl(tcp->seq) - MPS_FLOW_DIR(f, d)->isn);
	} else {
		__u32 len;
		struct opt_locs locs, *loc = &locs;
		if (scan(ctx, xdp, pc, loc))
			return -1;
		if (!(pc->kinds & MPS_K_DSS) || !f->idsn[d])
			return 0;
		__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_DSS, 4, &len);
		if (!o)
			return 0;
		__u8 fl = o[3];
		if (!(fl & 0x04)) /* no DSN mapping in this packet */
			return 0;
		__u32 at = 4 + ((fl & 0x01) ? ((fl & 0x02) ? 8 : 4) : 0);
		__u32 need = at + ((fl & 0x08) ? 8 : 4);
		if (need > len)
			return -1;
		__u8 *q = o + (at & 0xf);
		if (fl & 0x08) {
			if ((void *)(q + 8) > ctx_end(ctx, xdp))
				return 0;
			rel = bpf_be64_to_cpu(load_be64(q)) - f->idsn[d];
		} else {
			if ((void *)(q + 4) > ctx_end(ctx, xdp))
				return 0;
			rel = (__u32)(load_be32_h(q) - (__u32)f->idsn[d]);
		}
	}
	return rel >= p->lo && rel < p->hi;
}

static __always_inline int sel_flow_bytes(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					  const struct mps_step *st)
{
	const struct mps_p_bytes *p = &st->p.bytes;
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u32 payload = pc->l4_len - tcp->doff * 4;
	__u8 from_a;
	struct mps_flow *f = account(ctx, xdp, pc, &from_a);
	if (!f)
		return 0;
	__u64 seen = bytes_seen(f, p->scope == MPS_BYTES_CONN);
	seen -= seen >= payload ? payload : seen; /* bytes before this packet */
	return seen >= p->lo && seen < p->hi;
}

#endif
