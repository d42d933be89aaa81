/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Cursor parsers: each checks `hdr + 1 > end` before reading and returns a negative value
 * for anything malformed, so callers pass such packets untouched. Offsets are from the start
 * of the frame; multi-byte fields are returned in network byte order unless named *_h.
 */
#ifndef MPSTEER_PARSE_H
#define MPSTEER_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"

#define ETH_P_8021AD_ 0x88A8
#define TCPOPT_MPTCP  30
#define TCPOPT_WSCALE 3
#define TCPOPT_TS     8
#define TCP_MAX_OPTS  40

enum parse_result {
	PARSE_OK = 0,
	PARSE_SKIP = -1,      /* not TCP over IP: not ours */
	PARSE_MALFORMED = -2, /* lies about its lengths: unparseable */
	PARSE_FRAGMENT = -3,  /* TCP in an IP fragment: unparseable until the stack reassembles */
};

struct vlan_hdr_ {
	__be16 tci;
	__be16 encap_proto;
};

/* Ethernet with up to two VLAN tags (802.1Q / 802.1ad). */
static __always_inline int parse_eth(void *data, void *end, __u16 *off, __be16 *proto)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return PARSE_MALFORMED;
	*proto = eth->h_proto;
	*off = sizeof(*eth);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (*proto != bpf_htons(ETH_P_8021Q) && *proto != bpf_htons(ETH_P_8021AD_))
			break;
		struct vlan_hdr_ *vh = data + *off;
		if ((void *)(vh + 1) > end)
			return PARSE_MALFORMED;
		*proto = vh->encap_proto;
		*off += sizeof(*vh);
	}
	return PARSE_OK;
}

/* IPv4: rejects ihl < 5, lengths beyond the frame; TCP fragments are PARSE_FRAGMENT. */
static __always_inline int parse_ipv4(void *data, void *end, __u32 pkt_len, struct mps_pkt_ctx *pc)
{
	struct iphdr *ip = data + pc->l3_off;
	if ((void *)(ip + 1) > end)
		return PARSE_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;
	if (ip->protocol != IPPROTO_TCP)
		return PARSE_SKIP;
	if (ip->frag_off & bpf_htons(0x3fff)) /* MF or an offset */
		return PARSE_FRAGMENT;
	__u32 hlen = ip->ihl * 4;
	__u32 tot = bpf_ntohs(ip->tot_len);
	if (tot < hlen + sizeof(struct tcphdr))
		return PARSE_MALFORMED;
	if ((void *)ip + hlen > end || pc->l3_off + tot > pkt_len) /* truncated */
		return PARSE_MALFORMED;
	pc->family = 4;
	pc->l4_off = pc->l3_off + hlen;
	pc->l4_len = tot - hlen;
	return PARSE_OK;
}

/* IPv6: walks hop-by-hop, routing and destination options; a fragment header carrying TCP is
 * PARSE_FRAGMENT, other protocols skip. */
static __always_inline int parse_ipv6(void *data, void *end, __u32 pkt_len, struct mps_pkt_ctx *pc)
{
	struct ipv6hdr *ip6 = data + pc->l3_off;
	if ((void *)(ip6 + 1) > end)
		return PARSE_MALFORMED;
	if (ip6->version != 6)
		return PARSE_MALFORMED;
	__u8 next = ip6->nexthdr;
	__u32 off = pc->l3_off + sizeof(*ip6);
	__u32 plen = bpf_ntohs(ip6->payload_len);
	__u32 ext = 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING && next != IPPROTO_DSTOPTS)
			break;
		__u8 *eh = data + off;
		if ((void *)(eh + 2) > end)
			return PARSE_MALFORMED;
		__u32 len = (eh[1] + 1) * 8;
		next = eh[0];
		off += len;
		ext += len;
	}
	if (next == IPPROTO_FRAGMENT) {
		__u8 *fh = data + (off & 0x3ff);
		if ((void *)(fh + 1) > end)
			return PARSE_MALFORMED;
		return fh[0] == IPPROTO_TCP ? PARSE_FRAGMENT : PARSE_SKIP;
	}
	if (next != IPPROTO_TCP)
		return PARSE_SKIP;
	if (plen < ext + sizeof(struct tcphdr) || pc->l3_off + sizeof(*ip6) + plen > pkt_len)
		return PARSE_MALFORMED;
	pc->family = 6;
	pc->l4_off = off;
	pc->l4_len = plen - ext;
	return PARSE_OK;
}

/* TCP header: doff >= 5, the whole header inside the frame and inside the IP length. */
static __always_inline int parse_tcp(void *data, void *end, struct mps_pkt_ctx *pc)
{
	if (pc->l4_off >= 512 || pc->l3_off >= 64) /* deeper than any header stack we walk */
		return PARSE_SKIP;
	struct tcphdr *tcp = data + pc->l4_off;
	if ((void *)(tcp + 1) > end)
		return PARSE_MALFORMED;
	__u32 hlen = tcp->doff * 4;
	if (hlen < sizeof(*tcp) || hlen > pc->l4_len)
		return PARSE_MALFORMED;
	if ((void *)tcp + hlen > end)
		return PARSE_MALFORMED;
	return PARSE_OK;
}

/* Full L2-L4 parse into the packet context. */
static __always_inline int parse_packet(void *data, void *end, __u32 pkt_len,
					struct mps_pkt_ctx *pc)
{
	__be16 proto;
	__u16 off;
	int r = parse_eth(data, end, &off, &proto);
	if (r)
		return r;
	pc->l3_off = off;
	if (proto == bpf_htons(ETH_P_IP))
		r = parse_ipv4(data, end, pkt_len, pc);
	else if (proto == bpf_htons(ETH_P_IPV6))
		r = parse_ipv6(data, end, pkt_len, pc);
	else
		return PARSE_SKIP;
	if (r)
		return r;
	return parse_tcp(data, end, pc);
}

/* Where the options a step may need start (offset from the TCP header; 0 = absent) and
 * their lengths: the first occurrence of each, but for ADD_ADDR the one the kernel acts on
 * (add_addr_latest()). Index: the MPTCP subtype up to MP_PRIO (later subtypes are not
 * kept: no step reads them, and every caller holds this on a stack of 512 bytes), or OPT_TS /
 * OPT_WSCALE. */
enum opt_which {
	OPT_MPC = 0,
	OPT_JOIN = 1,
	OPT_DSS = 2,
	OPT_ADD = 3,
	OPT_PRIO = 5,
	OPT_TS = 6,
	OPT_WSCALE = 7,
	OPT_SLOTS = 8
};
struct opt_locs {
	__u8 off[OPT_SLOTS];
	__u8 len[OPT_SLOTS];
	/* The walk's opaque values pass through here (opaque_u16_via()): the option walk runs in
	 * a global function, whose arguments' memory the verifier does not track, and a stack
	 * slot of its own would push the deepest callers past 512 bytes. */
	__u8 scratch[4];
};

/*
 * The lengths the kernel accepts for MP_CAPABLE and MP_JOIN (net/mptcp/options.c,
 * mptcp_parse_option(): strict size checks, anything else is ignored), by the segment's flags:
 *   MP_CAPABLE  SYN 4 (v1) or 12 (v0, sender's key), SYN/ACK 12, ACK 20, with data 22 or 24;
 *   MP_JOIN     SYN 12, SYN/ACK 16, ACK 24.
 * An option of another length is not classified as its kind (nor as MPTCP at all): Linux
 * ignores it and may honour a well-formed option beside it. Arithmetic on the 0/1 flags, no
 * branch: the walks are verified per state.
 */
struct mptcp_lens {
	__u32 mpc_a, mpc_b, join;
};

static __always_inline struct mptcp_lens mptcp_lens_of(__u32 syn, __u32 ack, __u32 payload)
{
	struct mptcp_lens l;
	__u32 nosyn = syn ^ 1;
	l.mpc_a = syn * (4 + 8 * ack) + nosyn * (20 + 2 * payload);
	l.mpc_b = syn * 12 + nosyn * (20 + 4 * payload);
	l.join = syn * (12 + 4 * ack) + nosyn * 24;
	return l;
}

/* 1 when an MPTCP option of subtype `sub` and length `len` is one the kernel parses. */
static __always_inline __u32 mptcp_well_formed(const struct mptcp_lens *l, __u32 sub, __u32 len)
{
	if (sub == OPT_MPC)
		return len == l->mpc_a || len == l->mpc_b;
	if (sub == OPT_JOIN)
		return len == l->join;
	return 1;
}

/*
 * Of several ADD_ADDR options in one segment the kernel acts on the last whose length fits its
 * echo bit (mptcp_parse_option() overwrites one set of fields per option; an announcement is
 * 16/18 (IPv4, with a port) or 28/30 (IPv6) bytes, an echo 8/10 or 20/22). 1 when the option at
 * p of length len (p[2] readable) replaces the one recorded before it.
 */
static __always_inline __u32 add_addr_latest(const __u8 *p, __u32 len)
{
	__u32 base = (p[2] & 1) ? 8 : 16; /* echo: no HMAC */
	return len == base || len == base + 2 || len == base + 12 || len == base + 14;
}

/* v & mask, kept for the verifier where clang proves it idle and drops it: older verifiers (6.1)
 * do not narrow a value by a comparison with another register, nor a copy clang spilled, so a
 * pointer plus v may be refused without the mask. */
static __always_inline __u32 verifier_mask(__u32 v, __u32 mask)
{
	barrier_var(v);
	return v & mask;
}

/*
 * v (< 64k) through a stack slot the verifier does not track: a write narrower than 8 bytes at
 * an offset that is not a multiple of 8 leaves the slot "misc", so what is read back is an
 * unknown scalar whatever the verifier knew of v, and paths that differed only in such values
 * meet in one state. In asm because clang shrinks a local that is only partly used and may put
 * the halfword at an aligned offset. (Arithmetic tricks do not work: the 6.x verifiers track
 * negation and byte swaps too.) A store and a load, which the CPU forwards.
 */
static __always_inline __u32 opaque_u16_via(__u32 v, void *slot)
{
	asm volatile("*(u16 *)(%1 + 2) = %0; %0 = *(u16 *)(%1 + 2)"
		     : "+r"(v)
		     : "r"(slot)
		     : "memory");
	return v;
}

static __always_inline __u32 opaque_u16(__u32 v)
{
	__u64 slot;
	return opaque_u16_via(v, &slot);
}

/*
 * Walk the TCP options (at most 40 bytes) of the header at data + l4_off. Any option whose
 * length is < 2 or runs past the header is malformed. Returns the MPS_K_* kinds, or
 * PARSE_MALFORMED, and fills *loc (required). Written for the verifier: the loop is bounded by
 * its counter, kinds are built without branching per subtype, the offsets leave through memory
 * rather than registers so they are not tracked precisely along every path; the datapath calls
 * this from a global function, verified once per program.
 */
static __always_inline int scan_options(void *data, void *end, __u32 l4_off, __u32 l4_len,
					struct opt_locs *loc, __u32 l4_off_mask)
{
	if (l4_off > 512)
		return PARSE_MALFORMED;
	/* l4_off_mask: 0x3ff in a frame; 0 in a copy of the TCP header (l4_off is 0 there, and a
	 * wider range would put the header past the copy's end for the verifier). */
	struct tcphdr *tcp = data + (opaque_u16_via(l4_off, loc->scratch) & l4_off_mask);
	if ((void *)(tcp + 1) > end)
		return PARSE_MALFORMED;
	__u32 hlen = tcp->doff * 4;
	if (hlen < sizeof(*tcp) || hlen > l4_len)
		return PARSE_MALFORMED;
	/* Branch-free: every branch here would double the verifier's paths. */
	__u32 kinds = (__u32)tcp->syn << 13 | (__u32)tcp->fin << 14 | (__u32)tcp->rst << 15 |
		      (__u32)tcp->ack << 16 | (__u32)(l4_len > hlen) << 17;

	/* As in scan_kinds(): the loop counter is the only value the verifier knows precisely, so
	 * the paths through one option meet again at the loop head. A walk whose offset it
	 * tracked was verified once per path through all options: within 6.18's limits, past
	 * 6.1's (8192 branches pending). Few values live across the loop (the header, not the
	 * frame and its offset; the MPTCP lengths computed where needed): what does not fit in
	 * registers spills to a stack that the callers' and this function's share (512 bytes). */
	__u8 *base = (__u8 *)tcp;
	__u32 off = opaque_u16_via(sizeof(*tcp), loc->scratch);
	__u32 opt_end = opaque_u16_via(hlen, loc->scratch);
	for (int i = 0; i < TCP_MAX_OPTS; i++) {
		if (off >= opt_end)
			break;
		__u8 *p = base + (opaque_u16_via(off, loc->scratch) & 0x3f); /* off < hlen <= 60 */
		if ((void *)(p + 1) > end)
			return PARSE_MALFORMED;
		__u32 kind = p[0];
		if (kind == 0) /* end of option list */
			break;
		if (kind == 1) { /* NOP */
			off++;
			continue;
		}
		if ((void *)(p + 2) > end)
			return PARSE_MALFORMED;
		__u32 len = p[1];
		if (len < 2 || off + len > opt_end)
			return PARSE_MALFORMED;
		__u32 slot = OPT_SLOTS, latest = 0;
		if (kind == TCPOPT_MPTCP) {
			if (len < 3 || (void *)(p + 3) > end) /* MP_PRIO is the shortest: 3 */
				return PARSE_MALFORMED;
			__u32 sub = p[2] >> 4;
			/* sub up to MP_PRIO (5), or >= OPT_SLOTS (8) from MP_FAIL (6) on:
			 * arithmetic, since a branch on sub would make it precise (a path per
			 * subtype). */
			slot = sub | (((sub + 2) >> 3) << 3);
			struct mptcp_lens mlens =
			    mptcp_lens_of(tcp->syn, tcp->ack, (kinds >> 17) & 1);
			if (!mptcp_well_formed(&mlens, sub, len)) {
				off += len;
				continue;
			}
			latest = sub == OPT_ADD && add_addr_latest(p, len);
			kinds |= MPS_K_ANY_MPTCP | ((1u << sub) & 0x1ff);
			if (sub == OPT_DSS) {
				if (len < 4 || (void *)(p + 4) > end)
					return PARSE_MALFORMED;
				kinds |= (p[3] & 0x01u) << 9 | ((p[3] >> 4) & 0x01u) << 10;
			}
		} else if (kind == TCPOPT_TS && len == 10) {
			kinds |= MPS_K_TIMESTAMP;
			slot = OPT_TS;
		} else if (kind == TCPOPT_WSCALE && len == 3) {
			slot = OPT_WSCALE;
		}
		/* clang would test the subtype before its shift, which leaves slot unbounded for
		 * the verifier: the test is on slot itself. */
		barrier_var(slot);
		if (slot < OPT_SLOTS && (!loc->off[slot] || latest)) {
			loc->off[slot] = off;
			loc->len[slot] = len;
		}
		off += len;
	}
	/* Arithmetic, not a branch: a branch the verifier can decide makes kinds precise. */
	kinds |= (((kinds >> 11) & 1) << 12) ^ MPS_K_PLAIN_TCP;
	return kinds;
}

/*
 * Kinds only (no offsets): the same answer as scan_options(..., NULL), written to be inlined in
 * the interpreter's loop. The loop counter bounds the walk (40 option bytes, >= 1 each) and is
 * the only precise value: the offset, the kinds and the header length are never compared with
 * constants the verifier could decide, so the two successors of every branch (NOP or not,
 * MPTCP or not) meet again at the loop head in states it prunes. Each iteration is thus
 * verified about twice, ~1.5k instructions for the walk (scan_options() is written the same way).
 */
static __always_inline int scan_kinds(void *data, void *end, __u32 l4_off, __u32 l4_len,
				      __u32 *kinds_out)
{
	l4_off = opaque_u16(l4_off) & 0x1ff; /* < 512: parse_tcp() */
	struct tcphdr *tcp = data + l4_off;
	if ((void *)(tcp + 1) > end)
		return PARSE_MALFORMED;
	__u32 hlen = tcp->doff * 4;
	if (hlen < sizeof(*tcp) || hlen > l4_len)
		return PARSE_MALFORMED;
	__u32 kinds = (__u32)tcp->syn << 13 | (__u32)tcp->fin << 14 | (__u32)tcp->rst << 15 |
		      (__u32)tcp->ack << 16 | (__u32)(l4_len > hlen) << 17;
	struct mptcp_lens mlens = mptcp_lens_of(tcp->syn, tcp->ack, l4_len > hlen);
	/* The verifier must not know off or hlen (see above). */
	__u32 off = sizeof(*tcp);
	/* Linux puts NOP, NOP, timestamp first on every segment of a flow with timestamps: one
	 * comparison instead of three turns of the loop (the kernel's own fast path,
	 * tcp_parse_aligned_timestamp()). */
	__be32 *w = (__be32 *)(tcp + 1);
	if (hlen >= sizeof(*tcp) + 12 && (void *)(w + 1) <= end &&
	    *w == bpf_htonl(1 << 24 | 1 << 16 | TCPOPT_TS << 8 | 10)) {
		kinds |= MPS_K_TIMESTAMP;
		off += 12;
	}
	off = opaque_u16(l4_off + off);
	hlen = opaque_u16(l4_off + hlen);
	for (int i = 0; i < TCP_MAX_OPTS; i++) {
		if (off >= hlen)
			break;
		__u8 *p = data + (opaque_u16(off) & 0x3ff); /* off < hlen <= l4_off + 60 */
		if ((void *)(p + 1) > end)
			return PARSE_MALFORMED;
		__u32 kind = p[0];
		if (kind == 0) /* end of option list */
			break;
		if (kind == 1) { /* NOP */
			off++;
			continue;
		}
		if ((void *)(p + 2) > end)
			return PARSE_MALFORMED;
		__u32 len = p[1];
		if (len < 2 || off + len > hlen)
			return PARSE_MALFORMED;
		if (kind == TCPOPT_MPTCP) {
			if (len < 3 || (void *)(p + 3) > end)
				return PARSE_MALFORMED;
			__u32 sub = p[2] >> 4;
			if (!mptcp_well_formed(&mlens, sub, len)) {
				off += len;
				continue;
			}
			kinds |= MPS_K_ANY_MPTCP | ((1u << sub) & 0x1ff);
			if (sub == OPT_DSS) {
				if (len < 4 || (void *)(p + 4) > end)
					return PARSE_MALFORMED;
				kinds |= (p[3] & 0x01u) << 9 | ((p[3] >> 4) & 0x01u) << 10;
			}
		} else if (kind == TCPOPT_TS && len == 10) {
			kinds |= MPS_K_TIMESTAMP;
		}
		off += len;
	}
	/* Arithmetic, not a branch: a branch the verifier can decide makes kinds precise. */
	kinds |= (((kinds >> 11) & 1) << 12) ^ MPS_K_PLAIN_TCP;
	*kinds_out = kinds;
	return 0;
}

#endif
