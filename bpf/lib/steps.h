/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Chain mechanics every step program shares: the step table, counting, tail calls to the
 * next step or back to the interpreter, and the macros that make a step's XDP and TC programs.
 */
#ifndef MPSTEER_LIB_STEPS_H
#define MPSTEER_LIB_STEPS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <linux/pkt_cls.h>
#include "mpsteer/abi.h"
#include "chain_maps.h"
#include "shim.h"
#include "slots.h"

/* ---- chain mechanics -------------------------------------------------------------------- */

/*
 * The interpreter. The cheap selectors run inline (no call: a BPF-to-BPF call costs ~11 ns
 * here), and so do the actors that only give a verdict (pass, drop). Any other actor is a tail call
 * to its own program with a constant slot, which the JIT turns into a direct jump: a tail call
 * through a variable index is an indirect jump, ~13 ns behind a retpoline, against ~1 ns (see
 * bpf/README.md). The actor then tail-calls the interpreter (slot 0) to continue at its on_match
 * step.
 */
/* Step `at` of the packet's generation. */
static __always_inline const struct mps_step *step_at(const struct mps_pkt_ctx *pc, __u32 at)
{
	return &mps_slots.tables[ctx_slot(pc)].steps[at & (MPS_MAX_STEPS - 1)];
}

/* The step the packet is at. */
static __always_inline const struct mps_step *load_step(const struct mps_pkt_ctx *pc)
{
	return step_at(pc, pc->pc);
}

static __always_inline void step_count(const struct mps_pkt_ctx *pc, __u32 at, bool matched,
				       bool dropped)
{
	__u32 i = ctx_slot(pc) * MPS_MAX_STEPS + at;
	struct mps_step_counters *c = bpf_map_lookup_elem(&step_counters, &i);
	if (!c)
		return;
	c->runs++;
	if (matched)
		c->matched++;
	if (dropped)
		c->drops++;
}

/*
 * What a packet the datapath cannot read gets (malformed options or lengths, an IP fragment,
 * an actor's failed rewrite): passed untouched, unless a step with failure mode drop could
 * still decide it (MPS_STEPF_GUARDED on the step it stopped at), so that garbage never walks
 * around a guard. `at` is a valid pc.
 */
static __always_inline int unparseable(__u32 slot, __u32 at, bool xdp)
{
	const struct mps_step *st = &mps_slots.tables[slot & 1].steps[at & (MPS_MAX_STEPS - 1)];
	if (!(st->flags & MPS_STEPF_GUARDED))
		return PASS(xdp);
	gen_count_slot(slot & 1, MPS_GC_UNPARSEABLE_DROPS);
	return DROP(xdp);
}

static __always_inline int missed_tail_call(const struct mps_pkt_ctx *pc, __u32 at, __u8 step_flags,
					    bool xdp)
{
	gen_count(pc, MPS_GC_MISSED_TAIL_CALL);
	__u32 i = ctx_slot(pc) * MPS_MAX_STEPS + at;
	struct mps_step_counters *c = bpf_map_lookup_elem(&step_counters, &i);
	if (c)
		c->missed_tail_calls++;
	return (step_flags & MPS_STEPF_FAIL_DROP) ? DROP(xdp) : PASS(xdp);
}

#define TAIL(ctx, xdp, slot)                                                                       \
	do {                                                                                       \
		if (xdp)                                                                           \
			bpf_tail_call_static(ctx, &jmp_xdp, slot);                                 \
		else                                                                               \
			bpf_tail_call_static(ctx, &jmp_tc, slot);                                  \
	} while (0)

/* Count the hop and store the context. Nonzero: the chain cannot go on. */
static __always_inline int hand_over(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	pc->hops++;
	return pctx_store(ctx, xdp, pc);
}

/* Hand the packet to the program of step pc->pc (an actor, or a selector too costly to run
 * inline), or with `more` to the interpreter (slot 0) to go on after MPS_INLINE_STEPS steps.
 * Returns only when that fails. */
static __always_inline int call_prog(void *ctx, bool xdp, struct mps_pkt_ctx *pc, bool more)
{
	__u32 at = pc->pc;
	const struct mps_step *st = load_step(pc);
	__u8 flags = st->flags;
	pc->flags &= ~MPS_CTXF_WALKED; /* the walk was the last step's (it may have rewritten) */
	if (more && pc->hops >= MPS_MAX_CHAIN) {
		gen_count(pc, MPS_GC_CHAIN_TOO_LONG);
		return PASS(xdp);
	}
	if (hand_over(ctx, xdp, pc))
		return PASS(xdp);
	if (more) {
		TAIL(ctx, xdp, MPS_PROG_NONE);
		return missed_tail_call(pc, at, flags, xdp);
	}
	/* A constant index per program: each tail call is a direct jump. */
	switch (st->prog) {
#define MPS_PROG_TAIL(e, value, name, inl, options)                                                \
	case e:                                                                                    \
		if (!inl)                                                                          \
			TAIL(ctx, xdp, e);                                                         \
		break;
		MPS_PROGRAMS(MPS_PROG_TAIL)
#undef MPS_PROG_TAIL
	default:
		break;
	}
	return missed_tail_call(pc, at, flags, xdp);
}

/* The steps the interpreter runs inline; every other step is a program of its own. */
static __always_inline bool step_inline(__u8 prog)
{
	switch (prog) {
#define MPS_PROG_INLINE(e, value, name, inl, options)                                              \
	case e:                                                                                    \
		return inl;
		MPS_PROGRAMS(MPS_PROG_INLINE)
#undef MPS_PROG_INLINE
	default:
		return false;
	}
}

/* After a program step (pc->pc set to its successor, not the end): a successor that is a
 * program too is jumped to directly; only inline steps go back through the interpreter.
 * Live, every program a packet enters costs far more than its instructions (each hop is a
 * cold jump into another image), so a chain of actors skips the interpreter between them.
 * `at` and `flags` are the finished step's. Returns only when the chain cannot go on. */
static __always_inline int continue_chain(void *ctx, bool xdp, struct mps_pkt_ctx *pc, __u32 at,
					  __u8 flags)
{
	if (!step_inline(load_step(pc)->prog))
		return call_prog(ctx, xdp, pc, false);
	if (pctx_store(ctx, xdp, pc))
		return PASS(xdp);
	TAIL(ctx, xdp, MPS_PROG_NONE);
	return missed_tail_call(pc, at, flags, xdp);
}

/* A step program that cannot read its packet: counted, and the packet passes untouched
 * (unparseable()). */
static __always_inline int step_malformed(const struct mps_pkt_ctx *pc, bool xdp)
{
	gen_count(pc, MPS_GC_MALFORMED);
	return unparseable(ctx_slot(pc), pc->pc, xdp);
}

/* A step program's end: step `at` (with its `flags`) is done and counted; the chain goes on
 * at `next`, the end passing the packet. */
static __always_inline int step_next(void *ctx, bool xdp, struct mps_pkt_ctx *pc, __u32 at,
				     __u8 flags, __u16 next)
{
	pc->pc = next;
	if (pc->pc == MPS_PC_END)
		return PASS(xdp);
	return continue_chain(ctx, xdp, pc, at, flags);
}

/* The XDP and the TC program of one body (an attach type per program). */
#define XDP_AND_TC(name)                                                                           \
	SEC("xdp") int name##_xdp(struct xdp_md *ctx)                                              \
	{                                                                                          \
		return name##_body(ctx, true);                                                     \
	}                                                                                          \
	SEC("tc") int name##_tc(struct __sk_buff *ctx)                                             \
	{                                                                                          \
		return name##_body(ctx, false);                                                    \
	}

/* Selectors with their own program (they look up and update flow state). */
#define SELECTOR(name, expr)                                                                       \
	static __always_inline int name##_body(void *ctx, bool xdp)                                \
	{                                                                                          \
		struct mps_pkt_ctx pc;                                                             \
		if (pctx_load(ctx, xdp, &pc))                                                      \
			return PASS(xdp);                                                          \
		const struct mps_step *st = load_step(&pc);                                        \
		int m = (expr);                                                                    \
		if (m < 0)                                                                         \
			return step_malformed(&pc, xdp);                                           \
		step_count(&pc, pc.pc, m, false);                                                  \
		return step_next(ctx, xdp, &pc, pc.pc, st->flags, m ? st->on_match : st->on_miss); \
	}                                                                                          \
	XDP_AND_TC(name)

#define ACTOR(name, expr)                                                                          \
	static __always_inline int name##_body(void *ctx, bool xdp)                                \
	{                                                                                          \
		struct mps_pkt_ctx pc;                                                             \
		if (pctx_load(ctx, xdp, &pc))                                                      \
			return PASS(xdp);                                                          \
		const struct mps_step *st = load_step(&pc);                                        \
		int r = (expr);                                                                    \
		if (r < 0)                                                                         \
			return step_malformed(&pc, xdp);                                           \
		step_count(&pc, pc.pc, r > 0, false);                                              \
		return step_next(ctx, xdp, &pc, pc.pc, st->flags, st->on_match);                   \
	}                                                                                          \
	XDP_AND_TC(name)

#endif
