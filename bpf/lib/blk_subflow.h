/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * blk_subflow: an ADD_ADDR hidden (its HMAC invalidated), the option kept in `announces`.
 */
#ifndef MPSTEER_LIB_BLK_SUBFLOW_H
#define MPSTEER_LIB_BLK_SUBFLOW_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "packet.h"
#include "options.h"
#include "rewrite.h"
#include "events.h"
#include "flow.h"

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

#endif
