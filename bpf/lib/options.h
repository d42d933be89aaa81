/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The TCP option walk a step runs (offsets of the MPTCP options found, kinds cached in the
 * context), with and without kernel BTF, and reads of the options it found.
 */
#ifndef MPSTEER_LIB_OPTIONS_H
#define MPSTEER_LIB_OPTIONS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "mpsteer/parse.h"
#include "packet.h"

/*
 * The option walk with offsets, in a global function: verified once per program, in an empty
 * context. Inlined, the walk multiplies with the state of its caller (hundreds of thousands
 * of verifier instructions; past the million in most programs); the price is a BPF-to-BPF
 * call (~11 ns here), paid only by programs that read or write options (actors, SYNs), never
 * by the selector hot path.
 *
 * Without kernel BTF neither works: the verifier cannot tell a context argument of a global
 * function from a pointer to memory ("Caller passes invalid args": it knows the context's
 * type from the kernel's BTF), and the kernels without BTF users have (Debian's armmp) run
 * BPF in the interpreter, which takes no program that makes both subprogram calls and tail
 * calls. There the walk is a program of its own (opt_walk_*, below), verified once: the prog
 * arrays send each step that reads options to it first (the agent fills jmp_*[step] with it
 * and step_progs_*[step] with the step), and it leaves the offsets in this CPU's opt_walks
 * for the step (MPS_CTXF_WALKED says they are this packet's). It walks a per-CPU copy of the
 * TCP header, and the subprograms that take the context are inlined.
 */
#ifndef MPS_NO_KERNEL_BTF
#define MPS_CTX_SUBPROG __noinline

__noinline int opt_scan_xdp(struct xdp_md *ctx, __u32 l4_off, __u32 l4_len, struct opt_locs *loc)
{
	if (!loc)
		return PARSE_MALFORMED;
	__builtin_memset(loc, 0, sizeof(*loc));
	return scan_options((void *)(long)ctx->data, (void *)(long)ctx->data_end, l4_off, l4_len,
			    loc, 0x3ff);
}

__noinline int opt_scan_tc(struct __sk_buff *ctx, __u32 l4_off, __u32 l4_len, struct opt_locs *loc)
{
	if (!loc)
		return PARSE_MALFORMED;
	__builtin_memset(loc, 0, sizeof(*loc));
	return scan_options((void *)(long)ctx->data, (void *)(long)ctx->data_end, l4_off, l4_len,
			    loc, 0x3ff);
}
#else
#define MPS_CTX_SUBPROG static __always_inline

/* A TCP header (60 bytes at most), and room for the walk's reads past its last option byte. */
struct tcp_header_copy {
	__u8 b[68];
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tcp_header_copy);
} tcp_header_copies SEC(".maps");

/* The last walk on this CPU: read by the step the walk program hands the packet to. */
struct opt_walk {
	struct opt_locs loc;
	__s32 result; /* MPS_K_* kinds, or PARSE_MALFORMED */
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct opt_walk);
} opt_walks SEC(".maps");

/* The steps, by enum value, for the walk program to hand packets to. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, MPS_PROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
} step_progs_xdp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, MPS_PROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
} step_progs_tc SEC(".maps");

/* The TCP header at l4_off into this CPU's copy: 0, or <0 when the frame is shorter. */
static __always_inline int copy_tcp_header(void *ctx, bool xdp, __u32 l4_off,
					   struct tcp_header_copy **out)
{
	__u32 zero = 0;
	struct tcp_header_copy *h = bpf_map_lookup_elem(&tcp_header_copies, &zero);
	if (!h)
		return -1;
	long r = xdp ? bpf_xdp_load_bytes(ctx, l4_off, h->b, 20)
		     : bpf_skb_load_bytes(ctx, l4_off, h->b, 20);
	if (r)
		return -1;
	/* The whole header again, options included: one size the verifier knows is >= 20 (6.1
	 * does not narrow a "!= 0" test, and a size that may be 0 is refused). */
	__u32 hlen = (h->b[12] >> 4) * 4;
	if (hlen < 20)
		return -1;
	r = xdp ? bpf_xdp_load_bytes(ctx, l4_off, h->b, hlen)
		: bpf_skb_load_bytes(ctx, l4_off, h->b, hlen);
	if (r)
		return -1;
	*out = h;
	return 0;
}

/* The walk on this CPU's copy of the TCP header at l4_off (the walk program's). */
static __always_inline int opt_scan_copied(void *ctx, bool xdp, __u32 l4_off, __u32 l4_len,
					   struct opt_locs *loc)
{
	struct tcp_header_copy *h;
	__builtin_memset(loc, 0, sizeof(*loc));
	if (l4_off > 512 || copy_tcp_header(ctx, xdp, l4_off, &h))
		return PARSE_MALFORMED;
	return scan_options(h->b, h->b + sizeof(h->b), 0, l4_len, loc, 0);
}

/* The walk the walk program left for this packet, or PARSE_MALFORMED when there is none (a
 * step reached without it: a slot the agent did not route). */
static __always_inline int opt_scan_walked(const struct mps_pkt_ctx *pc, struct opt_locs *loc)
{
	__u32 zero = 0;
	struct opt_walk *w = bpf_map_lookup_elem(&opt_walks, &zero);
	if (!w || !(pc->flags & MPS_CTXF_WALKED))
		return PARSE_MALFORMED;
	__builtin_memcpy(loc, &w->loc, sizeof(*loc));
	return w->result;
}
#endif

/* Kinds into the context (cached for later programs), offsets into *loc. Returns <0 when
 * the options are malformed: a program that modifies a packet walks its options first, so a
 * malformed packet is never modified. */
static __always_inline int scan(void *ctx, bool xdp, struct mps_pkt_ctx *pc, struct opt_locs *loc)
{
#ifdef MPS_NO_KERNEL_BTF
	int r = opt_scan_walked(pc, loc);
#else
	int r = xdp ? opt_scan_xdp(ctx, pc->l4_off, pc->l4_len, loc)
		    : opt_scan_tc(ctx, pc->l4_off, pc->l4_len, loc);
#endif
	if (r < 0)
		return -1;
	pc->kinds = r;
	pc->flags |= MPS_CTXF_SCANNED;
	return 0;
}

/* Kinds only (no offsets): free when an earlier program already walked the options. */
static __always_inline int ensure_scanned(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct opt_locs loc;
	if (pc->flags & MPS_CTXF_SCANNED)
		return 0;
	return scan(ctx, xdp, pc, &loc);
}

/* A pointer to an option found by scan() with at least `need` bytes readable, or NULL (absent,
 * shorter than `need`, or outside the linear data). */
static __always_inline __u8 *opt_ptr(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
				     const struct opt_locs *loc, enum opt_which which, __u32 need,
				     __u32 *len)
{
	__u32 off = loc->off[which], l = loc->len[which];
	*len = l;
	if (!off || off > 60 || l < need)
		return NULL;
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return NULL;
	__u8 *o = (__u8 *)tcp + off;
	if ((void *)(o + need) > ctx_end(ctx, xdp)) /* need is a constant at every call site */
		return NULL;
	return o;
}

static __always_inline __u64 load_be64(const __u8 *p)
{
	__u64 v;
	__builtin_memcpy(&v, p, 8);
	return v;
}

static __always_inline __u32 load_be32_h(const __u8 *p)
{
	__u32 v;
	__builtin_memcpy(&v, p, 4);
	return bpf_ntohl(v);
}

#endif
