/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The selectors: the inline ones as branch-free matches over a tuple, and those with a
 * program of their own (token, sequence, flow_bytes) on flow state.
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
 * The selectors the interpreter runs inline, written branch-free over a tuple parsed once:
 * the interpreter loop is verified once per iteration, so every branch in here would be
 * paid 32 times over by the verifier.
 */
static __always_inline __u64 m_cidr(const struct tuple *t, __u8 family, const struct mps_p_cidr *p,
				    bool dst)
{
	const __u32 *a = dst ? t->dst : t->src;
	__u64 d = ((a[0] & p->mask[0]) ^ p->addr[0]) | ((a[1] & p->mask[1]) ^ p->addr[1]) |
		  ((a[2] & p->mask[2]) ^ p->addr[2]) | ((a[3] & p->mask[3]) ^ p->addr[3]) |
		  (__u64)(p->family ^ family);
	return is_zero(d);
}

/* Either direction; ports only for subflow. */
static __always_inline __u64 m_pair(const struct tuple *t, __u8 family, const struct mps_p_pair *p,
				    bool ports)
{
	__u64 fwd = (t->src[0] ^ p->a[0]) | (t->src[1] ^ p->a[1]) | (t->src[2] ^ p->a[2]) |
		    (t->src[3] ^ p->a[3]) | (t->dst[0] ^ p->b[0]) | (t->dst[1] ^ p->b[1]) |
		    (t->dst[2] ^ p->b[2]) | (t->dst[3] ^ p->b[3]);
	__u64 rev = (t->src[0] ^ p->b[0]) | (t->src[1] ^ p->b[1]) | (t->src[2] ^ p->b[2]) |
		    (t->src[3] ^ p->b[3]) | (t->dst[0] ^ p->a[0]) | (t->dst[1] ^ p->a[1]) |
		    (t->dst[2] ^ p->a[2]) | (t->dst[3] ^ p->a[3]);
	if (ports) {
		fwd |= (t->sport ^ p->port_a) | (t->dport ^ p->port_b);
		rev |= (t->sport ^ p->port_b) | (t->dport ^ p->port_a);
	}
	return (is_zero(fwd) | is_zero(rev)) & is_zero(p->family ^ family);
}

static __always_inline __u64 m_port(const struct tuple *t, const struct mps_p_port *p)
{
	__u64 s = in_range(t->sport, p->lo, p->hi) & (p->dir & MPS_DIR_SRC);
	__u64 d = in_range(t->dport, p->lo, p->hi) & ((p->dir & MPS_DIR_DST) >> 1);
	return s | d;
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
