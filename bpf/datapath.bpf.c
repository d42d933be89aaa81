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
#include <stddef.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "mpsteer/parse.h"
#include "state_maps.bpf.h"
#include "chain.bpf.h"
#include "shim.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static const struct mps_flow zero_flow;

/* ---- generations: two table slots ------------------------------------------------------ */

/*
 * The agent writes a generation into the slot no packet uses (through the mmapped .bss), flips
 * mps_slots.active, and waits for an RCU grace period before it writes the old slot again. A packet
 * reads mps_slots.active once, in its entry program, and carries the slot in its context
 * (MPS_CTXF_SLOT1), so it runs one generation from start to end. The preflight entries run
 * the slot in mps_slots.staged: the agent tests a generation before any packet can see it.
 */
struct mps_slots mps_slots;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MPS_IFACE_ENTRIES_MAX);
	__type(key, struct mps_iface_key);
	__type(value, __u16);
} iface_entries SEC(".maps");

static __always_inline __u32 ctx_slot(const struct mps_pkt_ctx *pc)
{
	return (pc->flags / MPS_CTXF_SLOT1) & 1;
}

static __always_inline void gen_count(const struct mps_pkt_ctx *pc, __u32 which)
{
	gen_count_slot(ctx_slot(pc), which);
}

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

/* ---- flow learning and accounting ------------------------------------------------------- */

/* rate_limit's right edge, per flow and direction of the window: how far the peer may send
 * (a sequence number) as of edge_ns (0: not set). Soft state with the loaded datapath, like
 * prio_tmpl. */
struct rate_edge {
	__u64 edge_ns[2];
	__u32 edge[2];
	__u32 most[2]; /* the credit the edge was last capped to (rate_window()'s `most`) */
};
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MPS_TABLE_PLACEHOLDER);
	__type(key, struct mps_flow_key);
	__type(value, struct rate_edge);
} rate_edges SEC(".maps");

/* Both sides' SYNs seen (SYN and SYN/ACK). */
static __always_inline bool handshake_done(const struct mps_flow *f)
{
	return f->dir_ab.wscale_known && f->dir_ba.wscale_known;
}

/* Whether a SYN may start the 4-tuple afresh: the flow ended, or it holds nothing a completed
 * handshake or the agent wrote (a SYN retransmitted, an entry made mid-stream). */
static __always_inline bool flow_restartable(const struct mps_flow *f)
{
	if (f->ended & MPS_FLOW_CLOSED)
		return true;
	return !handshake_done(f) && !(f->key[0] | f->key[1]) && !f->rate_bps && !f->conn_token;
}

/*
 * A SYN teaches the flow its ISN, window scale and MPTCP role. Done in the entry program
 * (SYNs are rare) so rate_limit knows the scale whichever steps saw the SYN.
 */
static __always_inline void learn_syn(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;
	__u32 len;

	struct opt_locs locs, *loc = &locs;
	if (scan(ctx, xdp, pc, loc) || load_tuple(ctx, xdp, pc, &t))
		return;
	flow_key(&t, pc->family, &k, &from_a);
	bool synack = pc->kinds & MPS_K_ACK;
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	/* One spoofed SYN or SYN/ACK must not rewrite a live flow (its keys, window scales,
	 * rate): a completed handshake is kept until the flow ends. */
	if (f && handshake_done(f) && !(f->ended & MPS_FLOW_CLOSED))
		return;
	if (!f || (!synack && flow_restartable(f))) {
		/* A SYN (not SYN/ACK) starts the flow afresh: older state is from a dead flow. */
		if (bpf_map_update_elem(&flows, &k, &zero_flow, BPF_ANY) == 0 && !f)
			count_insert(MPS_TI_FLOWS);
		bpf_map_delete_elem(&rate_edges, &k);
		f = bpf_map_lookup_elem(&flows, &k);
		if (!f)
			return;
		f->first_ns = bpf_ktime_get_coarse_ns();
	}
	if (f->ended & MPS_FLOW_CLOSED) /* a SYN/ACK for a flow no SYN restarted */
		return;
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return;
	__u32 d = from_a ? 0 : 1;
	MPS_FLOW_DIR(f, d)->isn = bpf_ntohl(tcp->seq);
	__u8 *ws = opt_ptr(ctx, xdp, pc, loc, OPT_WSCALE, 3, &len);
	MPS_FLOW_DIR(f, d)->wscale = ws ? (ws[2] > 14 ? 14 : ws[2]) : 0; /* RFC 7323 clamps to 14 */
	MPS_FLOW_DIR(f, d)->wscale_known = 1;
	MPS_FLOW_DIR(f, d)->wscale_sent = ws != NULL;
	if (pc->kinds & MPS_K_MP_JOIN) {
		f->role = MPS_ROLE_JOIN;
		/* MP_JOIN SYN (length 12): the token is the receiver's, i.e. the other side's. */
		__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_JOIN, 12, &len);
		if (o && !synack && len == 12) {
			__u32 tok = load_be32_h(o + 4);
			f->token[d ^ 1] = tok;
			f->backup = o[2] & 1;
			struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
			if (c && c->token[0] != tok) { /* the higher token: an alias entry */
				__u32 canon = c->token[0];
				c = bpf_map_lookup_elem(&conns, &canon);
			}
			/* Linked only to a connection entry that exists; otherwise the agent links
			 * it (and counts the subflow) when it sees the MP_JOIN event. */
			f->conn_token = c ? c->token[0] : 0;
			if (c) /* counted here: the agent never rewrites a connection entry */
				__sync_fetch_and_add(&c->subflows, 1);
		}
	} else if (pc->kinds & MPS_K_MP_CAPABLE) {
		f->role = MPS_ROLE_INITIAL;
	}
}

#ifndef MPS_NO_KERNEL_BTF /* there the walk program learns SYNs */
/* Nonzero when the options are malformed (the packet then passes untouched). */
MPS_CTX_SUBPROG int learn_syn_xdp(struct xdp_md *ctx, struct mps_pkt_ctx *pc)
{
	if (!pc)
		return -1;
	learn_syn(ctx, true, pc);
	return !(pc->flags & MPS_CTXF_SCANNED);
}

MPS_CTX_SUBPROG int learn_syn_tc(struct __sk_buff *ctx, struct mps_pkt_ctx *pc)
{
	if (!pc)
		return -1;
	learn_syn(ctx, false, pc);
	return !(pc->flags & MPS_CTXF_SCANNED);
}
#endif

/* TSval and TSecr of a segment, or nonzero when it has none (or malformed options). Linux
 * and most stacks put the option first, after two NOPs, on every segment past the handshake:
 * read there without the option walk; any other layout takes the walk. */
static __always_inline int load_timestamps(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					   __u32 *tsval, __u32 *tsecr)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u8 *o = (__u8 *)(tcp + 1);
	if (tcp->doff >= 8 && (void *)(o + 12) <= ctx_end(ctx, xdp) && o[0] == 1 && o[1] == 1 &&
	    o[2] == 8 && o[3] == 10) {
		*tsval = load_be32_h(o + 4);
		*tsecr = load_be32_h(o + 8);
		return 0;
	}
	struct opt_locs locs, *loc = &locs;
	__u32 len;
	if (scan(ctx, xdp, pc, loc) || !(pc->kinds & MPS_K_TIMESTAMP))
		return -1;
	o = opt_ptr(ctx, xdp, pc, loc, OPT_TS, 10, &len);
	if (!o)
		return -1;
	*tsval = load_be32_h(o + 2);
	*tsecr = load_be32_h(o + 6);
	return 0;
}

/* RTT from timestamps: one TSval per direction is remembered when it leaves; the first echo of
 * it (or of a later one) coming back closes the sample. Only a TSval sent at egress echoed back
 * at ingress measures this host's path RTT; the other way round it measures the local stack's
 * turnaround (which mixed in, once put srtt at 8 ms on a 20 ms path). A packet with no sample
 * to open or close reads no option. */
static __always_inline void sample_rtt(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
				       struct mps_flow *f, __u32 d)
{
	__u32 od = d ^ 1, tsval, tsecr;
	bool egress = pc->hook == MPS_HOOK_TC_EGRESS;
	if (egress ? MPS_FLOW_DIR(f, d)->ts_sent_ns != 0 : MPS_FLOW_DIR(f, od)->ts_sent_ns == 0)
		return;
	if (load_timestamps(ctx, xdp, pc, &tsval, &tsecr))
		return;
	if (egress) {
		MPS_FLOW_DIR(f, d)->ts_val = tsval;
		MPS_FLOW_DIR(f, d)->ts_sent_ns = bpf_ktime_get_ns();
		return;
	}
	/* Most packets arriving while a sample is open echo an older TSval: they leave before
	 * the clock read (a helper call, per packet). */
	if ((__s32)(tsecr - MPS_FLOW_DIR(f, od)->ts_val) < 0)
		return;
	__u64 sample = (bpf_ktime_get_ns() - MPS_FLOW_DIR(f, od)->ts_sent_ns) / 1000;
	MPS_FLOW_DIR(f, od)->ts_sent_ns = 0;
	if (sample == 0 || sample >= 60000000)
		return;
	__u32 srtt = f->srtt_us;
	if (!srtt) {
		f->srtt_us = sample;
		f->rttvar_us = sample / 2;
		return;
	}
	__s64 diff = (__s64)sample - srtt;
	if (diff < 0)
		diff = -diff;
	f->rttvar_us = (3 * (__u64)f->rttvar_us + diff) / 4;
	f->srtt_us = (7 * (__u64)srtt + sample) / 8;
}

/* The coarse clock as of this CPU's last read in the current tick. */
struct tick_clock {
	__u64 jiffies, ns;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tick_clock);
} tick_clocks SEC(".maps");

/* The coarse clock, read once per tick per CPU. bpf_jiffies64 is a load the verifier inlines,
 * the coarse clock a helper call, and live every call costs far more than its work (each
 * return goes through the SRSO return thunk on the machines measured). Both move at the tick,
 * so the value kept while jiffies stays the same is the coarse clock's, at most a tick behind
 * when read as the tick turns. */
static __always_inline __u64 tick_ns(void)
{
	__u32 zero = 0;
	struct tick_clock *c = bpf_map_lookup_elem(&tick_clocks, &zero);
	if (!c)
		return bpf_ktime_get_coarse_ns();
	__u64 j = bpf_jiffies64();
	if (c->jiffies != j) {
		c->jiffies = j;
		c->ns = bpf_ktime_get_coarse_ns();
	}
	return c->ns;
}

/* Moves `total - *held` into `*into` and `*held` to `total`, once whichever CPUs race. */
static __always_inline void move_counted(__u64 *held, __u64 total, __u64 *into)
{
	__u64 was = *held;
	if (total > was && __sync_val_compare_and_swap(held, was, total) == was)
		__sync_fetch_and_add(into, total - was);
}

/*
 * Adds to the flow's connection entry what the flow counted since the last time. Once per tick
 * and at a FIN or RST, not per packet: on every packet it was a second hash lookup, the
 * costliest part of record (README, "Performance"). A connection's entry thus lags its linked
 * flows by up to a tick while they send; readers that need it exact add the flows' part
 * (bytes_seen(), the agent's read).
 */
static __always_inline void conn_catch_up(struct mps_flow *f, __u64 now)
{
	__u32 tok = f->conn_token;
	struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
	if (!c)
		return;
	move_counted(&f->conn_packets, MPS_FLOW_PACKETS(f), &c->packets);
	move_counted(&f->conn_bytes, MPS_FLOW_BYTES(f), &c->bytes);
	if (now > c->last_ns)
		c->last_ns = now;
}

/*
 * Per-packet accounting (record, flow_bytes): packets, payload bytes, timestamps-based RTT.
 * Runs once per packet however many steps ask. Returns the flow (or NULL). The times are to
 * the clock tick (tick_ns); the precise clock only for an RTT sample.
 */
static __always_inline struct mps_flow *account(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
						__u8 *from_a_out)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;

	if (load_tuple(ctx, xdp, pc, &t))
		return NULL;
	flow_key(&t, pc->family, &k, &from_a);
	*from_a_out = from_a;
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	if (pc->flags & MPS_CTXF_ACCOUNTED)
		return f;
	pc->flags |= MPS_CTXF_ACCOUNTED;

	__u64 now = tick_ns();
	if (!f) {
		if (bpf_map_update_elem(&flows, &k, &zero_flow, BPF_NOEXIST) == 0)
			count_insert(MPS_TI_FLOWS);
		f = bpf_map_lookup_elem(&flows, &k);
		if (!f)
			return NULL;
		f->first_ns = now;
	}
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return f;
	__u32 d = from_a ? 0 : 1;
	__u32 payload = pc->l4_len - tcp->doff * 4;
	__sync_fetch_and_add(&MPS_FLOW_DIR(f, d)->packets, 1);
	__sync_fetch_and_add(&MPS_FLOW_DIR(f, d)->bytes, payload);
	/* Forward only: CPUs that read the coarse clock as the tick turned may hold one tick
	 * apart, and a flow seen from both would otherwise move back and forth. */
	bool new_tick = now > f->last_ns;
	if (new_tick)
		f->last_ns = now;
	if (f->conn_token && (new_tick || tcp->fin || tcp->rst))
		conn_catch_up(f, now);
	sample_rtt(ctx, xdp, pc, f, d);
	return f;
}

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

/* Payload bytes counted so far on the subflow (both directions) or, with `conn`, on its
 * connection once linked (until then the subflow is all there is): the entry's count plus
 * what this flow has not handed over yet (conn_catch_up()); the other subflows' last tick is
 * not in it. A connection has carried at least what any of its subflows has, even when its
 * entry was made anew. */
static __always_inline __u64 bytes_seen(const struct mps_flow *f, bool conn)
{
	__u64 seen = MPS_FLOW_BYTES(f);
	if (conn && f->conn_token) {
		__u64 held = f->conn_bytes;
		__u32 tok = f->conn_token;
		struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
		__u64 total = c ? c->bytes + (seen > held ? seen - held : 0) : 0;
		if (total > seen)
			seen = total;
	}
	return seen;
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

/* ---- actors ----------------------------------------------------------------------------- */

/* An actor answers 1 (applied), 0 (not applicable) or -1 (malformed: pass untouched);
 * afterwards the chain continues at on_match. pass and drop are verdicts of the interpreter. */

static __always_inline struct mps_event *event_new(__u32 type, const struct mps_pkt_ctx *pc,
						   const struct tuple *t)
{
	struct mps_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		gen_count(pc, MPS_GC_EVENTS_LOST);
		return NULL;
	}
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->type = type;
	ev->ts_ns = bpf_ktime_get_ns();
	ev->hook = pc->hook;
	flow_key(t, pc->family, &ev->flow, &ev->from_a);
	return ev;
}

/* MP_CAPABLE with keys: keep them in the flow (never lost), then report them. */
static __always_inline int act_get_connect(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	__u32 len;
	struct opt_locs locs, *loc = &locs;
	if (scan(ctx, xdp, pc, loc))
		return -1;
	if (!(pc->kinds & MPS_K_MP_CAPABLE))
		return 0;
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_MPC, 12, &len);
	if (!o)
		return 0;
	__u64 k0 = load_be64(o + 4), k1 = 0;
	__u8 version = o[2] & 0x0f, flags = o[3];
	if (len >= 20) {
		o = opt_ptr(ctx, xdp, pc, loc, OPT_MPC, 20, &len);
		if (!o)
			return 0;
		k1 = load_be64(o + 12);
	}

	struct mps_flow_key k;
	__u8 from_a;
	flow_key(&t, pc->family, &k, &from_a);
	/* Only for a flow whose MP_CAPABLE handshake the datapath saw, and only what it did not
	 * know yet: a packet with made-up keys creates no connection state and no event, and
	 * cannot replace the keys of a live connection. */
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	if (!f || f->role != MPS_ROLE_INITIAL || (f->ended & MPS_FLOW_CLOSED))
		return 0;
	/* The first key is the sender's; a third ACK also carries the receiver's. */
	__u32 mine = from_a ? 0 : 1;
	bool fresh = false;
	if (!f->key[mine]) {
		f->key[mine] = k0;
		fresh = true;
	}
	if (k1 && !f->key[mine ^ 1]) {
		f->key[mine ^ 1] = k1;
		fresh = true;
	}
	if (!fresh)
		return 1;
	struct mps_event *ev = event_new(MPS_EV_MP_CAPABLE, pc, &t);
	if (!ev)
		return 1;
	ev->version = version;
	ev->flags = flags;
	ev->key[0] = k0;
	ev->key[1] = k1;
	bpf_ringbuf_submit(ev, 0);
	return 1;
}

/* MP_JOIN SYN: report the token (the entry program already stored it in the flow). */
static __always_inline int act_get_subflow(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	__u32 len;
	struct opt_locs locs, *loc = &locs;
	if (scan(ctx, xdp, pc, loc))
		return -1;
	if ((pc->kinds & (MPS_K_MP_JOIN | MPS_K_SYN | MPS_K_ACK)) != (MPS_K_MP_JOIN | MPS_K_SYN))
		return 0;
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	__u8 *o = opt_ptr(ctx, xdp, pc, loc, OPT_JOIN, 12, &len);
	if (!o || len != 12)
		return 0;
	struct mps_event *ev = event_new(MPS_EV_MP_JOIN, pc, &t);
	if (!ev)
		return 1;
	ev->flags = o[2] & 1;
	ev->addr_id = o[3];
	ev->token = load_be32_h(o + 4);
	ev->nonce = load_be32_h(o + 8);
	bpf_ringbuf_submit(ev, 0);
	return 1;
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

/*
 * The window rate_limit advertises on a segment acknowledging `ack` (window direction d): up
 * to a right edge that moves at `rate` with time, never more than `most` ahead of the ack
 * (the bucket's depth, abi.h).
 * A window of rate x RTT holds the rate only where it spans several segments: under two the
 * peer waits for delayed ACKs, and the rate it reaches depends on the window's granularity
 * more than on the RTT. An edge that moves with time lets through exactly what the rate
 * allows by now, whatever the RTT: on a short path the peer sends it in bursts, stops at the
 * edge, and goes on at the next ACK or window probe.
 */
static __always_inline __u64 rate_window(void *ctx, bool xdp, struct mps_pkt_ctx *pc, __u32 d,
					 __u32 ack, __u64 rate, __u64 most)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;
	if (load_tuple(ctx, xdp, pc, &t))
		return most;
	flow_key(&t, pc->family, &k, &from_a);
	struct rate_edge *e = bpf_map_lookup_elem(&rate_edges, &k);
	if (!e) {
		struct rate_edge fresh = {};
		bpf_map_update_elem(&rate_edges, &k, &fresh, BPF_NOEXIST);
		e = bpf_map_lookup_elem(&rate_edges, &k);
		if (!e)
			return most;
	}
	d &= 1;
	if (most > MPS_RATE_WINDOW_MAX)
		most = MPS_RATE_WINDOW_MAX;
	__u64 now = bpf_ktime_get_ns();
	__u64 elapsed = now - e->edge_ns[d];
	/* Unset, or idle long enough (a SYN starting the 4-tuple afresh deletes it): the subflow
	 * starts with all the credit an idle one keeps. */
	if (!e->edge_ns[d] || elapsed > 2000000000ull) {
		e->edge[d] = ack + most;
		e->edge_ns[d] = now;
		e->most[d] = most;
		return most;
	}
	/* The ack a live subflow sends lies at most the credit of the last update behind the
	 * edge (stored as ack + at most that, and acks only grow): an older one (reordered,
	 * duplicated or forged) changes nothing, and its window the peer ignores anyway. */
	if ((__s32)(e->edge[d] - ack) > (__s64)e->most[d])
		return most;
	e->most[d] = most; /* a lower rate (or RTT) caps the credit below */
	if (elapsed > 1000000000ull) /* no overflow below: rate <= 5e10 */
		elapsed = 1000000000ull;
	__u64 grown = rate * elapsed / 1000000000ull;
	if (grown) { /* the remainder stays: the clock moves by what the bytes took */
		e->edge_ns[d] += grown * 1000000000ull / rate;
		if (now - e->edge_ns[d] > 1000000000ull)
			e->edge_ns[d] = now;
		e->edge[d] += grown;
	}
	/* Only time moves the edge forward: an ack past it (in flight before the cap applied, or
	 * forged) owes until time catches up, and gets a zero window meanwhile. */
	__s64 ahead = (__s32)(e->edge[d] - ack);
	if (ahead < 0)
		return 0;
	if (ahead > (__s64)most) { /* idle, or a lower rate: no credit beyond `most` */
		ahead = most;
		e->edge[d] = ack + most;
	}
	return ahead;
}

/*
 * Lower the advertised receive window so the peer sends at most `rate`: up to the right edge
 * rate_window() keeps (MPS_RATE_BURST_MS in abi.h). The window field is scaled by the shift
 * its sender announced in its SYN; without having seen that SYN the actor does nothing.
 * Never raises a window, never touches a SYN. The options are walked (a malformed packet is
 * never modified) only when a window is to be lowered.
 */
static __always_inline int rate_limit_flow(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					   const struct mps_step *st, struct mps_flow *f,
					   __u8 from_a)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	if (tcp->syn || tcp->rst || !tcp->ack || !f)
		return 0;
	__u32 d = from_a ? 0 : 1;
	/* The shift is in effect only when both SYNs carried the option (RFC 7323): without
	 * the whole negotiation seen, the window's meaning is unknown. */
	if (!f->dir_ab.wscale_known || !f->dir_ba.wscale_known)
		return 0;
	__u32 shift = f->dir_ab.wscale_sent && f->dir_ba.wscale_sent ? MPS_FLOW_DIR(f, d)->wscale : 0;
	__u64 rate = f->rate_bps ? f->rate_bps : st->p.rate.bytes_per_sec;
	__u64 rtt = f->srtt_us ? f->srtt_us : st->p.rate.rtt_us;
	if (!rate || !rtt)
		return 0;
	if (rate < MPS_RATE_MIN)
		rate = MPS_RATE_MIN;
	if (rate > MPS_RATE_MAX)
		rate = MPS_RATE_MAX;
	/* No overflow: rate <= 5e10 and rtt <= 6e7 (a minute, the longest sample taken) give
	 * at most 3e18 < 2^64 (a u32 rtt times the largest rate would not fit). */
	if (rtt > 60000000)
		rtt = 60000000;
	__u64 win = 2 * rate * rtt / 1000000;
	if (win < st->p.rate.min_window)
		win = st->p.rate.min_window;
	if (win < rate * MPS_RATE_BURST_MS / 1000)
		win = rate * MPS_RATE_BURST_MS / 1000;
	win = rate_window(ctx, xdp, pc, d, bpf_ntohl(tcp->ack_seq), rate, win);
	tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	/* Rounded down to the unit the window is counted in (up to 16 KB): a window rounded up
	 * would let the peer past the edge. Zero too: the peer then probes (after its RTO). */
	win >>= shift & 15;
	__u16 old = bpf_ntohs(tcp->window);
	if (win >= old)
		return 0;
	if (ensure_scanned(ctx, xdp, pc))
		return -1;
	tcp = view_tcp(ctx, xdp, pc); /* the walk's call leaves packet pointers unknown */
	if (!tcp)
		return -1;
	__be16 oldn = tcp->window, newn = bpf_htons((__u16)win);
	if (xdp) {
		tcp->window = newn;
		csum_replace2(&tcp->check, oldn, newn);
	} else {
		__u32 off = pc->l4_off;
		if (off > 512)
			return -1;
		if (bpf_skb_store_bytes(ctx, off + offsetof(struct tcphdr, window), &newn, 2, 0))
			return -1;
		bpf_l4_csum_replace(ctx, off + offsetof(struct tcphdr, check), oldn, newn, 2);
	}
	return 1;
}

static __always_inline int act_rate_limit(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					  const struct mps_step *st)
{
	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	if (tcp->syn || tcp->rst || !tcp->ack) /* before the lookup: nothing to lower */
		return 0;
	__u8 from_a;
	struct mps_flow *f = lookup_flow(ctx, xdp, pc, &from_a);
	return rate_limit_flow(ctx, xdp, pc, st, f, from_a);
}

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
	switch (st->prog) {
	case MPS_SEL_TOKEN:
		TAIL(ctx, xdp, MPS_SEL_TOKEN);
		break;
	case MPS_SEL_SEQUENCE:
		TAIL(ctx, xdp, MPS_SEL_SEQUENCE);
		break;
	case MPS_SEL_FLOW_BYTES:
		TAIL(ctx, xdp, MPS_SEL_FLOW_BYTES);
		break;
	case MPS_ACT_RECORD:
		TAIL(ctx, xdp, MPS_ACT_RECORD);
		break;
	case MPS_ACT_GET_CONNECT:
		TAIL(ctx, xdp, MPS_ACT_GET_CONNECT);
		break;
	case MPS_ACT_GET_SUBFLOW:
		TAIL(ctx, xdp, MPS_ACT_GET_SUBFLOW);
		break;
	case MPS_ACT_RATE_LIMIT:
		TAIL(ctx, xdp, MPS_ACT_RATE_LIMIT);
		break;
	case MPS_ACT_BLK_SUBFLOW:
		TAIL(ctx, xdp, MPS_ACT_BLK_SUBFLOW);
		break;
	case MPS_ACT_ADD_SUBFLOW:
		TAIL(ctx, xdp, MPS_ACT_ADD_SUBFLOW);
		break;
	case MPS_ACT_SET_BACKUP:
		TAIL(ctx, xdp, MPS_ACT_SET_BACKUP);
		break;
	case MPS_ACT_NO_SUBFLOWS:
		TAIL(ctx, xdp, MPS_ACT_NO_SUBFLOWS);
		break;
	case MPS_ACT_REDIRECT:
		TAIL(ctx, xdp, MPS_ACT_REDIRECT);
		break;
	case MPS_ACT_REJECT:
		TAIL(ctx, xdp, MPS_ACT_REJECT);
		break;
	default:
		break;
	}
	return missed_tail_call(pc, at, flags, xdp);
}

/* The steps the interpreter runs inline; every other step is a program of its own. */
static __always_inline bool step_inline(__u8 prog)
{
	switch (prog) {
	case MPS_SEL_SUBFLOW:
	case MPS_SEL_IP_PAIR:
	case MPS_SEL_SRC:
	case MPS_SEL_DST:
	case MPS_SEL_PORT:
	case MPS_SEL_PACKET_TYPE:
	case MPS_ACT_PASS:
	case MPS_ACT_DROP:
		return true;
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
 * that needs its own program (WALK_PROG), the option walk (WALK_SCAN, for packet_type: the
 * walk runs once, between two copies of this loop, so the verifier sees it from a handful of
 * states rather than once per iteration) or after MPS_INLINE_STEPS steps (WALK_MORE).
 */
static __always_inline int walk(void *ctx, bool xdp, struct mps_pkt_ctx *pc, const struct tuple *t)
{
	for (int i = 0; i < MPS_INLINE_STEPS; i++) {
		__u32 at = pc->pc;
		if (at == MPS_PC_END)
			return WALK_PASS;
		const struct mps_step *st = load_step(pc);
		__u64 m;
		switch (st->prog) {
		case MPS_SEL_SUBFLOW:
			m = m_pair(t, pc->family, &st->p.pair, true);
			break;
		case MPS_SEL_IP_PAIR:
			m = m_pair(t, pc->family, &st->p.pair, false);
			break;
		case MPS_SEL_SRC:
			m = m_cidr(t, pc->family, &st->p.cidr, false);
			break;
		case MPS_SEL_DST:
			m = m_cidr(t, pc->family, &st->p.cidr, true);
			break;
		case MPS_SEL_PORT:
			m = m_port(t, &st->p.port);
			break;
		case MPS_SEL_PACKET_TYPE:
			if (!(pc->flags & MPS_CTXF_SCANNED))
				return WALK_SCAN;
			m = is_zero(pc->kinds & st->p.kinds.any_of) ^ 1;
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

/*
 * FIN or RST: a FIN from each side, or a RST, ends the flow: marked closed and reported once
 * (MPS_EV_FLOW_CLOSED) so the agent forgets it; the entry stays for the LRU or the next SYN.
 * Flows the datapath holds no entry for are not reported. Done in the entry program (rare
 * packets; the compiled entries hand them on).
 */
static __always_inline void learn_close(void *ctx, bool xdp, struct mps_pkt_ctx *pc, bool rst)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;
	if (load_tuple(ctx, xdp, pc, &t))
		return;
	flow_key(&t, pc->family, &k, &from_a);
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &k);
	if (!f || (f->ended & MPS_FLOW_CLOSED))
		return;
	__u32 now = rst ? MPS_FLOW_CLOSED : (from_a ? MPS_FLOW_FIN_A : MPS_FLOW_FIN_B);
	__u32 was = __sync_fetch_and_or(&f->ended, now);
	__u32 is = was | now;
	if (!rst && (is & (MPS_FLOW_FIN_A | MPS_FLOW_FIN_B)) == (MPS_FLOW_FIN_A | MPS_FLOW_FIN_B)) {
		was = __sync_fetch_and_or(&f->ended, MPS_FLOW_CLOSED);
		is |= MPS_FLOW_CLOSED;
	}
	if (!(is & MPS_FLOW_CLOSED) || (was & MPS_FLOW_CLOSED)) /* open, or another CPU reported */
		return;
	struct mps_event *ev = event_new(MPS_EV_FLOW_CLOSED, pc, &t);
	if (!ev)
		return;
	ev->flags = rst;
	bpf_ringbuf_submit(ev, 0);
}

MPS_CTX_SUBPROG int learn_close_xdp(struct xdp_md *ctx, struct mps_pkt_ctx *pc, int rst)
{
	if (!pc)
		return -1;
	learn_close(ctx, true, pc, rst);
	return 0;
}

MPS_CTX_SUBPROG int learn_close_tc(struct __sk_buff *ctx, struct mps_pkt_ctx *pc, int rst)
{
	if (!pc)
		return -1;
	learn_close(ctx, false, pc, rst);
	return 0;
}

static __always_inline int run_chain(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct tuple t;
	if (load_tuple(ctx, xdp, pc, &t))
		return PASS(xdp);
	int r = walk(ctx, xdp, pc, &t);
	if (r == WALK_SCAN)
		r = scan_kinds_ctx(ctx, xdp, pc) ? WALK_MALFORMED : walk(ctx, xdp, pc, &t);
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

SELECTOR(sel_token, sel_token(ctx, xdp, &pc, st))
SELECTOR(sel_sequence, sel_sequence(ctx, xdp, &pc, st))
SELECTOR(sel_flow_bytes, sel_flow_bytes(ctx, xdp, &pc, st))

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

/* Option-rewriting actors live in their own file. */
#include "rewrite.bpf.h"
