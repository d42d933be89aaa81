/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The context shim: one body serves XDP and TC through a constant `xdp` flag, and the
 * per-packet context travels in a per-CPU map at XDP (xdp_pkt_ctx, chain_maps.h) or in skb->cb
 * at TC (compiled entries write it the same way).
 */
#ifndef MPSTEER_LIB_SHIM_H
#define MPSTEER_LIB_SHIM_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"
#include "chain_maps.h"

#define PASS(xdp) ((xdp) ? XDP_PASS : TC_ACT_UNSPEC)
#define DROP(xdp) ((xdp) ? XDP_DROP : TC_ACT_SHOT)

static __always_inline void *ctx_data(void *ctx, bool xdp)
{
	return xdp ? (void *)(long)((struct xdp_md *)ctx)->data
		   : (void *)(long)((struct __sk_buff *)ctx)->data;
}

static __always_inline void *ctx_end(void *ctx, bool xdp)
{
	return xdp ? (void *)(long)((struct xdp_md *)ctx)->data_end
		   : (void *)(long)((struct __sk_buff *)ctx)->data_end;
}

static __always_inline int pctx_load(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	if (xdp) {
		__u32 zero = 0;
		struct mps_pkt_ctx *c = bpf_map_lookup_elem(&xdp_pkt_ctx, &zero);
		if (!c)
			return -1;
		__builtin_memcpy(pc, c, sizeof(*pc));
	} else {
		struct __sk_buff *s = ctx;
		__u32 *w = (__u32 *)pc;
		w[0] = s->cb[0];
		w[1] = s->cb[1];
		w[2] = s->cb[2];
		w[3] = s->cb[3];
		w[4] = s->cb[4];
	}
	return 0;
}

static __always_inline int pctx_store(void *ctx, bool xdp, const struct mps_pkt_ctx *pc)
{
	if (xdp) {
		__u32 zero = 0;
		struct mps_pkt_ctx *c = bpf_map_lookup_elem(&xdp_pkt_ctx, &zero);
		if (!c)
			return -1;
		__builtin_memcpy(c, pc, sizeof(*pc));
	} else {
		struct __sk_buff *s = ctx;
		const __u32 *w = (const __u32 *)pc;
		s->cb[0] = w[0];
		s->cb[1] = w[1];
		s->cb[2] = w[2];
		s->cb[3] = w[3];
		s->cb[4] = w[4];
	}
	return 0;
}

#endif
