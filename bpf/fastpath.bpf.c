// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Compiled entries: one hook's chain specialised into a program of its own, loaded per
 * generation and attached in place of the datapath's entry (bpf/README.md, "Compiled entries").
 *
 * The chain is read-only data (`cfg`, frozen before the load), so the verifier knows every
 * step's program, targets and parameters, follows only the branches they take and removes the
 * rest: what the JIT sees is the straight run of this chain's selectors. The interpreter pays a
 * table load, a switch and branch-free matching of every selector kind per step; this pays a
 * compare. It covers the common case only (Ethernet, IPv4 without options, TCP, not a SYN) and
 * hands anything else, unchanged, to the entry program, which does it all (VLAN, IPv6, options,
 * SYN learning, malformed accounting). Program steps (actors, stateful selectors) go to their
 * programs exactly as the interpreter sends them.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <stdbool.h>
#include <stddef.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "mpsteer/parse.h"
#include "shim.bpf.h"
#include "chain.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct mps_fast_cfg cfg;

/* Read through a pointer clang cannot see through: it loads each field once and keeps it in
 * a register (through `cfg` itself every read is volatile), while the verifier still knows
 * it points into frozen read-only data and so knows every value. */
static __always_inline const struct mps_fast_cfg *config(void)
{
	const struct mps_fast_cfg *c = (const struct mps_fast_cfg *)&cfg;
	asm volatile("" : "+r"(c));
	return c;
}

/* The datapath's maps: the loader hands over their file descriptors (this .bss is the
 * datapath's, which holds exactly the slots; the others are in chain.bpf.h). */
struct mps_slots mps_slots;


/* A program step's program: the key comes from the configuration, so the verifier knows it
 * and the JIT makes the call a direct jump. */
static __always_inline void tail(void *ctx, bool xdp, __u32 key)
{
	if (xdp)
		bpf_tail_call(ctx, &jmp_xdp, key);
	else
		bpf_tail_call(ctx, &jmp_tc, key);
}

/* The entry program of this hook (or its preflight twin): constant keys, one call each. */
static __always_inline void to_entry(void *ctx, bool xdp, bool preflight)
{
	if (xdp) {
		if (preflight)
			bpf_tail_call_static(ctx, &jmp_xdp, MPS_JMP_PREFLIGHT + MPS_HOOK_XDP);
		else
			bpf_tail_call_static(ctx, &jmp_xdp, MPS_JMP_ENTRY + MPS_HOOK_XDP);
	} else if (config()->hook == MPS_HOOK_TC_EGRESS) {
		if (preflight)
			bpf_tail_call_static(ctx, &jmp_tc, MPS_JMP_PREFLIGHT + MPS_HOOK_TC_EGRESS);
		else
			bpf_tail_call_static(ctx, &jmp_tc, MPS_JMP_ENTRY + MPS_HOOK_TC_EGRESS);
	} else {
		if (preflight)
			bpf_tail_call_static(ctx, &jmp_tc, MPS_JMP_PREFLIGHT + MPS_HOOK_TC_INGRESS);
		else
			bpf_tail_call_static(ctx, &jmp_tc, MPS_JMP_ENTRY + MPS_HOOK_TC_INGRESS);
	}
}

static __always_inline __u32 slot(void)
{
	return config()->live & 1;
}

static __always_inline void gen_count(__u32 which)
{
	gen_count_slot(slot(), which);
}

static __always_inline void step_count(__u32 pc, bool dropped, bool missed)
{
	__u32 i = slot() * MPS_MAX_STEPS + pc;
	struct mps_step_counters *c = bpf_map_lookup_elem(&step_counters, &i);
	if (!c)
		return;
	if (missed) {
		c->missed_tail_calls++;
		return;
	}
	c->runs++;
	c->matched++;
	if (dropped)
		c->drops++;
}

/* Ethernet, IPv4 without options, TCP, not a SYN, every length consistent: the checks of
 * parse_packet() for exactly this shape. Returns the TCP length (header + payload), 0 when the
 * packet is not of this shape. */
static __always_inline __u32 parse_fast(void *data, void *end, __u32 pkt_len)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return 0;
	/* Three words instead of six fields: Ethernet type, IP version and ihl (TOS masked);
	 * the fragment bits and the protocol (TTL masked). */
	__u32 w12 = *(__u32 *)(data + 12), w20 = *(__u32 *)(data + 20);
	if ((w12 & bpf_htonl(0xffffff00)) != bpf_htonl(ETH_P_IP << 16 | 0x4500) ||
	    (w20 & bpf_htonl(0x3fff00ff)) != bpf_htonl(IPPROTO_TCP))
		return 0;
	__u32 tot = bpf_ntohs(ip->tot_len);
	__u32 doff_flags = bpf_ntohs(*(__u16 *)((void *)tcp + 12));
	__u32 hlen = doff_flags >> 12 << 2;
	if (tot < 2 * sizeof(struct tcphdr) || sizeof(*eth) + tot > pkt_len || hlen < sizeof(*tcp) ||
	    hlen > tot - sizeof(*ip) || (void *)tcp + hlen > end || (doff_flags & 0x02 /* SYN */))
		return 0;
	return tot - sizeof(*ip);
}

/* The selectors on an IPv4 packet. The loader turned steps that cannot match IPv4 (another
 * family, IPv6 words) into MPS_PROG_NONE, which never matches here. Branch-free, like the
 * interpreter's: a comparison that branched would teach the verifier something about the
 * packet on each side, so every path through the selectors would reach the option walk in a
 * state of its own and be verified again (hundreds of milliseconds per load).
 * `ports`: the TCP header's first word as loaded. */
static __always_inline __u16 sport_of(__u32 ports)
{
	return bpf_ntohs((__u16)ports);
}

static __always_inline __u16 dport_of(__u32 ports)
{
	return bpf_ntohs((__u16)(ports >> 16));
}

static __always_inline __u64 m_cidr(const struct mps_p_cidr *p, __u32 addr)
{
	return is_zero((addr & p->mask[0]) ^ p->addr[0]);
}

static __always_inline __u64 m_pair(const struct mps_p_pair *p, bool with_ports, __u32 s, __u32 d,
				    __u32 ports)
{
	__u64 fwd = (s ^ p->a[0]) | (d ^ p->b[0]);
	__u64 rev = (s ^ p->b[0]) | (d ^ p->a[0]);
	if (with_ports) {
		fwd |= (sport_of(ports) ^ p->port_a) | (dport_of(ports) ^ p->port_b);
		rev |= (sport_of(ports) ^ p->port_b) | (dport_of(ports) ^ p->port_a);
	}
	return is_zero(fwd) | is_zero(rev);
}

static __always_inline __u64 m_port(const struct mps_p_port *p, __u32 ports)
{
	return (in_range(sport_of(ports), p->lo, p->hi) & (p->dir & MPS_DIR_SRC)) |
	       (in_range(dport_of(ports), p->lo, p->hi) & ((p->dir & MPS_DIR_DST) >> 1));
}

/* v through a stack slot the verifier does not track (see opaque_u16() in parse.h): after the
 * option walk every way out of it carries different known bits in `kinds`; forgotten here,
 * they meet in one state instead of each verifying the rest of the chain again. */
static __always_inline __u32 opaque_u32(__u32 v)
{
	__u64 slot[2];
	asm volatile("*(u32 *)(%1 + 4) = %0; %0 = *(u32 *)(%1 + 4)"
		     : "+r"(v)
		     : "r"(slot)
		     : "memory");
	return v;
}

/* A program step: the context the interpreter would hand over, then its program. Returns
 * only when that fails (counted, answered with the step's failure mode). */
static __always_inline int hand_over(void *ctx, bool xdp, const struct mps_fast_step *st,
				     __u32 l4_len, __u32 kinds, bool scanned)
{
	gen_count(MPS_GC_PACKETS);
	struct mps_pkt_ctx pc = {
		.pc = st->pc,
		.hops = 1,
		.flags = slot() * MPS_CTXF_SLOT1 | (scanned ? MPS_CTXF_SCANNED : 0),
		.family = 4,
		.hook = config()->hook,
		.l3_off = sizeof(struct ethhdr),
		.l4_off = sizeof(struct ethhdr) + sizeof(struct iphdr),
		.l4_len = l4_len,
		.kinds = kinds,
	};
	if (xdp && bpf_xdp_adjust_meta(ctx, -(int)sizeof(pc))) {
		gen_count(MPS_GC_NO_META);
		return PASS(xdp);
	}
	if (pctx_store(ctx, xdp, &pc))
		return PASS(xdp);
	tail(ctx, xdp, st->prog);
	gen_count(MPS_GC_MISSED_TAIL_CALL);
	step_count(st->pc, false, true);
	return (st->flags & MPS_STEPF_FAIL_DROP) ? DROP(xdp) : PASS(xdp);
}

static __always_inline int fast(void *ctx, bool xdp, __u32 pkt_len)
{
	const struct mps_fast_cfg *c = config();
	/* Not our generation (yet, or any more): the entry program runs whichever is. Under
	 * test (the agent's pre-flight, before any link holds this program) the preflight entry
	 * takes what this one does not, so the staged generation runs throughout. */
	if (*(volatile __u32 *)&mps_slots.active != c->live &&
	    *(volatile __u32 *)&mps_slots.testing != c->live) {
		to_entry(ctx, xdp, false);
		return PASS(xdp);
	}

	void *data = ctx_data(ctx, xdp), *end = ctx_end(ctx, xdp);
	__u32 l4_len = parse_fast(data, end, pkt_len);
	if (!l4_len) {
		to_entry(ctx, xdp, *(volatile __u32 *)&mps_slots.active != c->live);
		return PASS(xdp);
	}
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u32 *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end) /* parse_fast() checked; the verifier forgot */
		return PASS(xdp);
	__u32 saddr = ip->saddr, daddr = ip->daddr, ports = *tcp;
	/* Whether the options were walked is a flag of its own: a test of `kinds` would make the
	 * verifier track it exactly, and every way through the walk would become a state. */
	__u32 kinds = 0;
	bool scanned = false;

	/* Steps are numbered so that every jump goes forward: one pass over them runs a chain.
	 * The packet is counted where it leaves (helpers clobber the registers parsing filled). */
	__u32 at = c->first;
#pragma unroll
	for (__u32 i = 0; i < MPS_FAST_STEPS; i++) {
		if (i >= c->nsteps)
			break;
		if (at != i)
			continue;
		const struct mps_fast_step *st = &c->steps[i];
		__u64 m;
		switch (st->prog) {
		case MPS_PROG_NONE: m = 0; break;
		case MPS_SEL_SUBFLOW: m = m_pair(&st->p.pair, true, saddr, daddr, ports); break;
		case MPS_SEL_IP_PAIR: m = m_pair(&st->p.pair, false, saddr, daddr, ports); break;
		case MPS_SEL_SRC: m = m_cidr(&st->p.cidr, saddr); break;
		case MPS_SEL_DST: m = m_cidr(&st->p.cidr, daddr); break;
		case MPS_SEL_PORT: m = m_port(&st->p.port, ports); break;
		case MPS_SEL_PACKET_TYPE:
			if (!scanned) {
				if (scan_kinds(ctx_data(ctx, xdp), ctx_end(ctx, xdp),
					       sizeof(struct ethhdr) + sizeof(struct iphdr), l4_len,
					       &kinds)) {
					gen_count(MPS_GC_PACKETS);
					gen_count(MPS_GC_MALFORMED);
					return PASS(xdp);
				}
				kinds = opaque_u32(kinds);
				scanned = true;
			}
			m = is_zero(kinds & st->p.kinds.any_of) ^ 1;
			break;
		case MPS_ACT_PASS:
			gen_count(MPS_GC_PACKETS);
			step_count(st->pc, false, false);
			return PASS(xdp);
		case MPS_ACT_DROP:
			gen_count(MPS_GC_PACKETS);
			step_count(st->pc, true, false);
			return DROP(xdp);
		default:
			return hand_over(ctx, xdp, st, l4_len, kinds, scanned);
		}
		at = m ? st->on_match : st->on_miss;
		if (at == MPS_FAST_END)
			break;
	}
	gen_count(MPS_GC_PACKETS);
	return PASS(xdp);
}

SEC("xdp")
int fast_xdp(struct xdp_md *ctx)
{
	return fast(ctx, true, ctx->data_end - ctx->data);
}

SEC("tc")
int fast_tc(struct __sk_buff *skb)
{
	return fast(skb, false, skb->len);
}
