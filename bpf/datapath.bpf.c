// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The mpsteer datapath: entry programs for XDP ingress, TC egress and TC ingress, the chain
 * interpreter, and one program per selector and actor that needs its own (an XDP and a TC
 * variant of one shared body). Loaded once; a generation is the contents of one of the two
 * table slots, and switching generations flips `mps_slots.active`. The chain format, maps, counters
 * and the switch protocol are described in bpf/README.md.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"
#include "mpsteer/parse.h"
#include "lib/shim.h"
#include "lib/slots.h"
#include "lib/options.h"
#include "lib/flow.h"
#include "lib/selectors.h"
#include "lib/actors.h"
#include "lib/steps.h"
#include "lib/interp.h"
#include "lib/blk_subflow.h"
#include "lib/set_backup.h"
#include "lib/no_subflows.h"
#include "lib/add_subflow.h"
#include "lib/reject.h"
#include "lib/redirect.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("xdp")
int entry_xdp(struct xdp_md *ctx)
{
	return entry(ctx, true, MPS_HOOK_XDP, ctx->ingress_ifindex, false);
}

SEC("tc")
int entry_tc_egress(struct __sk_buff *skb)
{
	return entry(skb, false, MPS_HOOK_TC_EGRESS, skb->ifindex, false);
}

SEC("tc")
int entry_tc_ingress(struct __sk_buff *skb)
{
	return entry(skb, false, MPS_HOOK_TC_INGRESS, skb->ifindex, false);
}

/* The same entries on the staged slot, for the agent's pre-flight (BPF_PROG_TEST_RUN only). */
SEC("xdp")
int preflight_xdp(struct xdp_md *ctx)
{
	return entry(ctx, true, MPS_HOOK_XDP, ctx->ingress_ifindex, true);
}

SEC("tc")
int preflight_tc_egress(struct __sk_buff *skb)
{
	return entry(skb, false, MPS_HOOK_TC_EGRESS, skb->ifindex, true);
}

SEC("tc")
int preflight_tc_ingress(struct __sk_buff *skb)
{
	return entry(skb, false, MPS_HOOK_TC_INGRESS, skb->ifindex, true);
}

/* Slot 0: where actors come back to continue the chain. */
static __always_inline int interp_body(void *ctx, bool xdp)
{
	struct mps_pkt_ctx pc;
	if (pctx_load(ctx, xdp, &pc))
		return PASS(xdp);
	return run_chain(ctx, xdp, &pc);
}
XDP_AND_TC(interp)

#ifdef MPS_NO_KERNEL_BTF
/*
 * The option walk's program (built without kernel BTF; see opt_scan_walked()): walks the
 * packet's options into this CPU's opt_walks, then learns the SYN the entry program handed it
 * and runs the chain, or hands the packet to the step at pc->pc.
 */
static __always_inline int opt_walk_body(void *ctx, bool xdp)
{
	struct mps_pkt_ctx pc;
	__u32 zero = 0;
	if (pctx_load(ctx, xdp, &pc))
		return PASS(xdp);
	struct opt_walk *w = bpf_map_lookup_elem(&opt_walks, &zero);
	if (!w)
		return PASS(xdp);
	w->result = opt_scan_copied(ctx, xdp, pc.l4_off, pc.l4_len, &w->loc);
	pc.flags |= MPS_CTXF_WALKED;
	__u32 at = pc.pc;
	if (pc.flags & MPS_CTXF_LEARN_SYN) {
		pc.flags &= ~MPS_CTXF_LEARN_SYN;
		learn_syn(ctx, xdp, &pc);
		bool learn_only = at == MPS_PC_END;   /* the entry ran no chain but learns */
		if (!(pc.flags & MPS_CTXF_SCANNED)) { /* a SYN with malformed options */
			gen_count(&pc, MPS_GC_MALFORMED);
			return learn_only ? PASS(xdp) : unparseable(ctx_slot(&pc), at, xdp);
		}
		if (learn_only || pctx_store(ctx, xdp, &pc))
			return PASS(xdp);
		TAIL(ctx, xdp, MPS_PROG_NONE);
		return missed_tail_call(&pc, at, 0, xdp);
	}
	const struct mps_step *st = load_step(&pc);
	if (pctx_store(ctx, xdp, &pc))
		return PASS(xdp);
	if (xdp)
		bpf_tail_call(ctx, &step_progs_xdp, st->prog);
	else
		bpf_tail_call(ctx, &step_progs_tc, st->prog);
	return missed_tail_call(&pc, at, st->flags, xdp);
}
XDP_AND_TC(opt_walk)
#endif

/* Selectors with their own program (they look up and update flow state). */
SELECTOR(sel_token, sel_token(ctx, xdp, &pc, st))
SELECTOR(sel_sequence, sel_sequence(ctx, xdp, &pc, st))
SELECTOR(sel_flow_bytes, sel_flow_bytes(ctx, xdp, &pc, st))

/*
 * record, and a rate_limit step right after it (the usual pair) on the flow record found: live,
 * entering one more program and looking the flow up again cost more than the rate_limit's own
 * work. The pair counts and fails as the two steps would.
 */
static __always_inline int act_record_body(void *ctx, bool xdp)
{
	struct mps_pkt_ctx pc;
	if (pctx_load(ctx, xdp, &pc))
		return PASS(xdp);
	const struct mps_step *st = load_step(&pc);
	__u8 from_a;
	struct mps_flow *f = account(ctx, xdp, &pc, &from_a);
	step_count(&pc, pc.pc, f != NULL, false);
	if (st->on_match == MPS_PC_END || step_at(&pc, st->on_match)->prog != MPS_ACT_RATE_LIMIT)
		return step_next(ctx, xdp, &pc, pc.pc, st->flags, st->on_match);
	pc.pc = st->on_match;
	st = load_step(&pc);
	int r = rate_limit_flow(ctx, xdp, &pc, st, f, from_a);
	if (r < 0)
		return step_malformed(&pc, xdp);
	step_count(&pc, pc.pc, r > 0, false);
	return step_next(ctx, xdp, &pc, pc.pc, st->flags, st->on_match);
}
XDP_AND_TC(act_record)

ACTOR(act_get_connect, act_get_connect(ctx, xdp, &pc))
ACTOR(act_get_subflow, act_get_subflow(ctx, xdp, &pc))
ACTOR(act_rate_limit, act_rate_limit(ctx, xdp, &pc, st))

/* A bare parse-and-pass program, the yardstick the benchmark measures chains against. */
SEC("xdp")
int bench_parse_only(struct xdp_md *ctx)
{
	struct mps_pkt_ctx pc = {};
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (parse_packet(data, end, end - data, &pc))
		return XDP_PASS;
	/* uses the result so the walk is not optimised out */
	__u32 kinds;
	return scan_kinds(data, end, pc.l4_off, pc.l4_len, &kinds) ? XDP_DROP : XDP_PASS;
}

SEC("xdp")
int bench_bare_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* The floor under a chain's cost: the header reads and checks a chain of the benchmark's
 * selectors cannot do without, written by hand for the benchmark's frame (IPv4 without
 * options, no VLAN; NOP NOP TS then a DSS ending the header), without what the datapath adds
 * (the generation check, counters, steps from a table). The frame's own path returns XDP_PASS,
 * any other XDP_ABORTED, so no check can be optimised away. */
static __always_inline struct iphdr *bench_floor_ip(struct xdp_md *ctx, __u32 len)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	if (data + len > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return NULL;
	if (*(__u8 *)ip != 0x45 || ip->protocol != IPPROTO_TCP ||
	    (ip->frag_off & bpf_htons(0x3fff)))
		return NULL;
	return ip;
}

/* chain4_nomatch's floor: the packet's shape and its destination, which misses. */
SEC("xdp")
int bench_floor_nomatch(struct xdp_md *ctx)
{
	struct iphdr *ip = bench_floor_ip(ctx, sizeof(struct ethhdr) + sizeof(struct iphdr));
	if (!ip)
		return XDP_ABORTED;
	return (ip->daddr & bpf_htonl(0xffffff00)) == bpf_htonl(0x0a090000) ? XDP_ABORTED
									    : XDP_PASS;
}

/* chain4_match's floor: destination, destination port, then the DSS's presence. */
SEC("xdp")
int bench_floor_match(struct xdp_md *ctx)
{
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = bench_floor_ip(ctx, sizeof(struct ethhdr) + sizeof(struct iphdr) +
						   sizeof(struct tcphdr));
	if (!ip || (ip->daddr & bpf_htonl(0xffffff00)) != bpf_htonl(0x0a000100))
		return XDP_ABORTED;
	struct tcphdr *tcp = (void *)(ip + 1);
	if (tcp->dest != bpf_htons(5201))
		return XDP_ABORTED;
	__u8 *o = (void *)(tcp + 1);
	if ((void *)(o + 16) > end || *(__u32 *)o != bpf_htonl(0x0101080a))
		return XDP_ABORTED;
	if (o[12] != 30 || (o[14] >> 4) != 2 || tcp->doff * 4 != 32 + o[13])
		return XDP_ABORTED;
	return XDP_PASS;
}

/* record's flow lookup taken apart for the benchmark: the packet parsed and its flow key built
 * (both directions one key), then that key looked up in the flow table (the frame's entry is
 * made on the first run, so the runs measured find it). */
static __always_inline int bench_flow_key_of(struct xdp_md *ctx, struct mps_flow_key *k)
{
	struct mps_pkt_ctx pc = {};
	struct tuple t;
	__u8 from_a;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (parse_packet(data, end, end - data, &pc) || load_tuple(ctx, true, &pc, &t))
		return -1;
	flow_key(&t, pc.family, k, &from_a);
	barrier_var(from_a);
	return 0;
}

SEC("xdp")
int bench_flow_key(struct xdp_md *ctx)
{
	struct mps_flow_key k;
	if (bench_flow_key_of(ctx, &k))
		return XDP_DROP;
	/* the key is written whole to the stack, as for a lookup */
	asm volatile("" : : "r"(&k) : "memory");
	return XDP_PASS;
}

SEC("xdp")
int bench_flow_lookup(struct xdp_md *ctx)
{
	struct mps_flow_key k;
	if (bench_flow_key_of(ctx, &k))
		return XDP_DROP;
	if (bpf_map_lookup_elem(&flows, &k))
		return XDP_PASS;
	bpf_map_update_elem(&flows, &k, &zero_flow, BPF_NOEXIST);
	return XDP_PASS;
}

/* What a per-CPU cache of the last flow's key would cost on a hit: the key built and compared
 * with this CPU's last one (nothing found with it: a map value cannot hold a pointer to
 * another map's entry, so the cache could only hold a copy of the flow). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mps_flow_key);
} bench_last_key SEC(".maps");

SEC("xdp")
int bench_flow_cache_hit(struct xdp_md *ctx)
{
	struct mps_flow_key k;
	__u32 zero = 0;
	if (bench_flow_key_of(ctx, &k))
		return XDP_DROP;
	struct mps_flow_key *last = bpf_map_lookup_elem(&bench_last_key, &zero);
	if (!last)
		return XDP_DROP;
	const __u32 *x = (const __u32 *)&k, *y = (const __u32 *)last;
	__u32 diff = 0;
#pragma unroll
	for (__u32 i = 0; i < sizeof(k) / 4; i++)
		diff |= x[i] ^ y[i];
	if (diff)
		*last = k;
	return XDP_PASS;
}

/* Option-rewriting actors (lib/rewrite.h and one header each); the loader puts each program in
 * the prog-array slot of its enum mps_prog value. */
ACTOR(act_blk_subflow, act_blk_subflow(ctx, xdp, &pc))
ACTOR(act_set_backup, act_set_backup(ctx, xdp, &pc, st))
ACTOR(act_no_subflows, act_no_subflows(ctx, xdp, &pc))
XDP_AND_TC(act_add_subflow)
XDP_AND_TC(act_reject)
XDP_AND_TC(act_redirect)
