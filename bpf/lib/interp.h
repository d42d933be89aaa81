/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The chain interpreter (the inline steps, the option walk between two runs of them) and the
 * entry every hook runs: a packet parsed, learnt from, and handed to its generation's chain.
 */
#ifndef MPSTEER_LIB_INTERP_H
#define MPSTEER_LIB_INTERP_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/tcp.h>
#include "mpsteer/abi.h"
#include "mpsteer/parse.h"
#include "chain_maps.h"
#include "shim.h"
#include "slots.h"
#include "packet.h"
#include "options.h"
#include "flow.h"
#include "selectors.h"
#include "steps.h"

/*
 * Steps one program runs inline before it hands the chain to a fresh interpreter (slot 0, a
 * direct tail call). The verifier walks the loop once per iteration (the counter is precise),
 * so this bounds its work per program; chains up to 8 inline steps (16 when a packet_type step
 * sits among them) never pay the extra tail call.
 */
#define MPS_INLINE_STEPS 8

enum walk_result { WALK_PASS, WALK_DROP, WALK_PROG, WALK_SCAN, WALK_MALFORMED, WALK_MORE };

/*
 * Run the inline steps from pc->pc: the cheap selectors and the verdicts. Stops at a step
 * that needs its own program (WALK_PROG), the option walk (WALK_SCAN, for a test of the
 * packet's kinds: the
 * walk runs once, between two copies of this loop, so the verifier sees it from a handful of
 * states rather than once per iteration) or after MPS_INLINE_STEPS steps (WALK_MORE).
 */
static __always_inline int walk(void *ctx, bool xdp, struct mps_pkt_ctx *pc, struct match_tuple *mt)
{
	/* The packet's step table and each step in registers: left to itself the compiler
	 * computes their addresses again for every field it reads. */
	const struct mps_step *steps = step_at(pc, 0);
	barrier_var(steps);
	for (int i = 0; i < MPS_INLINE_STEPS; i++) {
		__u32 at = pc->pc;
		if (at == MPS_PC_END)
			return WALK_PASS;
		const struct mps_step *st = &steps[at & (MPS_MAX_STEPS - 1)];
		barrier_var(st);
		__u64 m;
		switch (st->prog) {
		case MPS_SEL_MATCH:
			if (st->p.match.flags & (MPS_MATCHF_KINDS | MPS_MATCHF_IP)) {
				if ((st->p.match.flags & MPS_MATCHF_KINDS) &&
				    !(pc->flags & MPS_CTXF_SCANNED))
					return WALK_SCAN;
				if ((st->p.match.flags & MPS_MATCHF_IP) && !mt->have_ip &&
				    load_match_ip(ctx, xdp, pc, mt))
					return WALK_MALFORMED;
			}
			m = m_match(mt, &st->p.match);
			break;
		case MPS_ACT_PASS:
			step_count(pc, at, true, false);
			return WALK_PASS;
		case MPS_ACT_DROP:
			step_count(pc, at, true, true);
			return WALK_DROP;
		default:
			return WALK_PROG;
		}
		/* No per-step hop count here: the loop bound cuts inline runs, the loader rejects
		 * cycles and paths over MPS_MAX_CHAIN, and the kernel's tail-call limit bounds the
		 * programs. Selectors are not counted either: a counter update costs as much as
		 * the selector; actors and verdicts count what a policy did. */
		__u16 on_match = st->on_match, on_miss = st->on_miss;
		pc->pc = on_miss ^ ((on_match ^ on_miss) & (__u16) - (__s64)m);
	}
	return WALK_MORE;
}

/* The kinds of the packet (no offsets), inline: ~7 ns against ~20 for the call to
 * opt_scan_*() that scan() makes. */
static __always_inline int scan_kinds_ctx(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	__u32 kinds;
	if (scan_kinds(ctx_data(ctx, xdp), ctx_end(ctx, xdp), pc->l4_off, pc->l4_len, &kinds))
		return -1;
	pc->kinds = kinds;
	pc->flags |= MPS_CTXF_SCANNED;
	return 0;
}

static __always_inline int run_chain(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct match_tuple mt;
	if (load_match_tuple(ctx, xdp, pc, &mt))
		return PASS(xdp);
	int r = walk(ctx, xdp, pc, &mt);
	if (r == WALK_SCAN) {
		if (scan_kinds_ctx(ctx, xdp, pc)) {
			r = WALK_MALFORMED;
		} else {
			mt.w[MPS_W_KINDS] = mt.w[MPS_W_KINDS ^ MPS_W_SWAP] = pc->kinds;
			r = walk(ctx, xdp, pc, &mt);
		}
	}
	switch (r) {
	case WALK_DROP:
		return DROP(xdp);
	case WALK_PROG:
		return call_prog(ctx, xdp, pc, false);
	case WALK_MORE:
		return call_prog(ctx, xdp, pc, true);
	case WALK_MALFORMED:
		gen_count(pc, MPS_GC_MALFORMED);
		return unparseable(ctx_slot(pc), pc->pc, xdp);
	default:
		return PASS(xdp);
	}
}

static __always_inline int entry(void *ctx, bool xdp, __u8 hook, __u32 ifindex, bool preflight)
{
	struct mps_pkt_ctx pc = {};
	__u32 pkt_len;

	__u32 slot = (preflight ? *(volatile __u32 *)&mps_slots.staged
				: *(volatile __u32 *)&mps_slots.active) &
		     1;
	const struct mps_entry *e = &mps_slots.tables[slot].entries[hook];
	/* With per-interface chains the default pc is often END (every policy names its
	 * interfaces): look the interface up before giving up. */
	__u32 first = e->pc;
	if (e->flags & MPS_ENTRYF_PER_IFACE) {
		struct mps_iface_key ik = {.ifindex = ifindex, .hook = hook, .slot = slot};
		__u16 *p = bpf_map_lookup_elem(&iface_entries, &ik);
		if (p)
			first = *p;
	}
	bool learn_only = first == MPS_PC_END;
	if (learn_only && !(e->flags & MPS_ENTRYF_LEARN))
		return PASS(xdp);
	gen_count_slot(slot, MPS_GC_PACKETS);

	if (xdp) {
		pkt_len = ((struct xdp_md *)ctx)->data_end - ((struct xdp_md *)ctx)->data;
	} else {
		struct __sk_buff *skb = ctx;
		pkt_len = skb->len;
		/* Headers of a non-linear skb may sit outside the linear area. */
		if (skb->data_end - skb->data < 134 && skb->len > skb->data_end - skb->data)
			bpf_skb_pull_data(skb, skb->len < 134 ? skb->len : 134);
	}
	int r = parse_packet(ctx_data(ctx, xdp), ctx_end(ctx, xdp), pkt_len, &pc);
	if (r) {
		gen_count_slot(slot, r == PARSE_MALFORMED ? MPS_GC_MALFORMED : MPS_GC_NOT_TCP);
		return r == PARSE_SKIP || learn_only ? PASS(xdp) : unparseable(slot, first, xdp);
	}
	pc.hook = hook;
	pc.pc = first;
	pc.flags = slot * MPS_CTXF_SLOT1;
	/* (Hiding the parsed offsets from the verifier with opaque_u16() here saves only ~8% of
	 * its work on this program and costs ~3 ns per packet: not done.) */
	struct tcphdr *tcp = view_tcp(ctx, xdp, &pc);
	if (tcp && tcp->syn) {
#ifdef MPS_NO_KERNEL_BTF
		/* The walk program learns it, then runs the chain. */
		pc.flags |= MPS_CTXF_LEARN_SYN;
		if (pctx_store(ctx, xdp, &pc))
			return PASS(xdp);
		TAIL(ctx, xdp, MPS_JMP_OPT_WALK);
		pc.flags &= ~MPS_CTXF_LEARN_SYN; /* not learnt: the chain runs all the same */
		gen_count(&pc, MPS_GC_MISSED_TAIL_CALL);
#else
		/* SYNs are rare: learning from them is a call (verified once, not per state). */
		int bad = xdp ? learn_syn_xdp(ctx, &pc) : learn_syn_tc(ctx, &pc);
		if (bad) { /* a SYN with malformed options */
			gen_count(&pc, MPS_GC_MALFORMED);
			return learn_only ? PASS(xdp) : unparseable(slot, first, xdp);
		}
#endif
	} else if (tcp && (tcp->fin || tcp->rst)) {
		int rst = tcp->rst;
		if (xdp)
			learn_close_xdp(ctx, &pc, rst);
		else
			learn_close_tc(ctx, &pc, rst);
	}
	if (learn_only)
		return PASS(xdp);
	return run_chain(ctx, xdp, &pc);
}

#endif
