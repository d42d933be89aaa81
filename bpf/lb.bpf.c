// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The MPTCP-aware load balancer (mpsteer/lb.h): XDP on a balancer node's ingress. Packets to a
 * VIP go to a backend, direct server return at L2; everything else passes untouched.
 *   - a SYN without MP_JOIN: the Maglev slot of its flow hash names the backend;
 *   - an MP_JOIN SYN: the backend that owns its token (learnt from the connection's third ACK
 *     through the agent), never a hashed one; an unknown token gets the VIP's action;
 *   - anything else: the backend its subflow's SYN went to (an LRU entry), or the hash when the
 *     entry is gone (the balancer restarted, or the entry was evicted);
 *   - a non-SYN carrying MP_CAPABLE with both keys (the client's third ACK): the server's key is
 *     reported to the agent, which derives the token and writes lb_tokens.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "mpsteer/abi.h"
#include "mpsteer/parse.h"
#include "mpsteer/lb.h"
#include "lib/syn_reset.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MPS_LB_MAX_VIPS);
	__type(key, struct mps_lb_vip_key);
	__type(value, struct mps_lb_vip);
} lb_vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MPS_LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct mps_lb_backend);
} lb_backends SEC(".maps");

/* Two tables of lb_params.table_size slots: table t's slot s at t * MPS_LB_TABLE_MAX + s. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * MPS_LB_TABLE_MAX);
	__type(key, __u32);
	__type(value, __u32);
} lb_table SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mps_lb_params);
} lb_params SEC(".maps");

/* Sized by the agent before load (bpf_map__set_max_entries). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct mps_lb_flow_key);
	__type(value, struct mps_lb_flow);
} lb_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct mps_lb_token);
} lb_tokens SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} lb_learn SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MPS_LB_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} lb_counters SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&lb_counters, &which);
	if (c)
		*c += 1;
}

/* src/lb/maglev.h, flow_hash(): FNV-1a 64 over version, saddr, daddr, sport, dport, protocol
 * (14 bytes for IPv4, 38 for IPv6), then fmix64. */
static __always_inline __u64 flow_hash(const struct mps_lb_flow_key *k)
{
	__u8 b[38];
	__u32 alen = k->family == 4 ? 4 : 16;
	b[0] = k->family;
	__builtin_memcpy(b + 1, k->saddr, 16);
	__builtin_memcpy(b + 17, k->daddr, 16);
	if (k->family == 4) { /* the IPv4 layout is packed: addresses 4 bytes each */
		__builtin_memcpy(b + 5, k->daddr, 4);
		__builtin_memcpy(b + 9, &k->sport, 2);
		__builtin_memcpy(b + 11, &k->dport, 2);
		b[13] = IPPROTO_TCP;
	} else {
		__builtin_memcpy(b + 33, &k->sport, 2);
		__builtin_memcpy(b + 35, &k->dport, 2);
		b[37] = IPPROTO_TCP;
	}
	__u32 n = 1 + 2 * alen + 5;
	__u64 h = 0xcbf29ce484222325ull;
	for (__u32 i = 0; i < 38; i++) {
		if (i >= n)
			break;
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

/* The backend of the flow's Maglev slot; MPS_LB_MAX_BACKENDS when there is none. A function
 * of its own (verified once, not once per path of the caller). */
__noinline __u32 hashed_backend(const struct mps_lb_flow_key *k)
{
	if (!k)
		return MPS_LB_MAX_BACKENDS;
	__u32 zero = 0;
	struct mps_lb_params *p = bpf_map_lookup_elem(&lb_params, &zero);
	if (!p || !p->table_size || p->table_size > MPS_LB_TABLE_MAX)
		return MPS_LB_MAX_BACKENDS;
	__u32 slot = (p->active & 1) * MPS_LB_TABLE_MAX + (__u32)(flow_hash(k) % p->table_size);
	__u32 *b = bpf_map_lookup_elem(&lb_table, &slot);
	return b ? *b : MPS_LB_MAX_BACKENDS;
}

/* Direct server return: the backend's MAC over the frame's, out by the backend's interface. */
static __always_inline int forward(struct xdp_md *ctx, __u32 backend)
{
	struct mps_lb_backend *b = bpf_map_lookup_elem(&lb_backends, &backend);
	if (!b || !(b->flags & MPS_LB_BACKEND_LIVE)) {
		count(MPS_LB_C_NO_BACKEND);
		return XDP_DROP;
	}
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, b->mac, 6);
	__builtin_memcpy(eth->h_source, b->src_mac, 6);
	if (b->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(b->ifindex, 0);
}

/*
 * The SYN at l4 turned into the reset a host with no such connection answers (syn_reset()),
 * addresses, ports and MACs swapped, options and payload cut, checksums complete; sent back
 * out. A SYN with IPv4 options or IPv6 extension headers is dropped instead (a reply would
 * have to reverse them).
 */
static __always_inline int reset(struct xdp_md *ctx, const struct mps_pkt_ctx *pc)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u32 l3 = pc->l3_off & 0x3f, l4 = pc->l4_off & 0x1ff;
	if (l4 - l3 != (pc->family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)))
		return XDP_DROP;
	struct tcphdr *tcp = data + l4;
	if ((void *)(tcp + 1) > end)
		return XDP_DROP;
	const __u32 payload = pc->l4_len - tcp->doff * 4;
	struct tcphdr rst;
	__u32 ps[10] = {};
	if (pc->family == 4) {
		struct iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end ||
		    syn_reset(tcp, payload, 4, &ip->saddr, &ip->daddr, &rst, ps))
			return XDP_DROP;
	} else {
		struct ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end ||
		    syn_reset(tcp, payload, 6, (const __u32 *)&ip6->saddr,
			      (const __u32 *)&ip6->daddr, &rst, ps))
			return XDP_DROP;
	}
	__u32 new_len = l4 + sizeof(rst);
	__s32 cut = (__s32)new_len - (__s32)(end - data);
	if (cut && bpf_xdp_adjust_tail(ctx, cut))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__u8 mac[6];
	__builtin_memcpy(mac, eth->h_dest, 6);
	__builtin_memcpy(eth->h_dest, eth->h_source, 6);
	__builtin_memcpy(eth->h_source, mac, 6);
	if (pc->family == 4) {
		struct iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return XDP_DROP;
		ip->saddr = ps[0];
		ip->daddr = ps[1];
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(rst));
		ip->ttl = 64;
		ip->check = 0;
		__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0);
		if (sum < 0)
			return XDP_DROP;
		ip->check = ~csum_fold32((__u64)sum);
	} else {
		struct ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return XDP_DROP;
		__builtin_memcpy(&ip6->saddr, ps, 16);
		__builtin_memcpy(&ip6->daddr, ps + 4, 16);
		ip6->payload_len = bpf_htons(sizeof(rst));
		ip6->hop_limit = 64;
	}
	tcp = data + l4;
	if ((void *)(tcp + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(tcp, &rst, sizeof(rst));
	return XDP_TX;
}

/* The option walk (mpsteer/parse.h), verified once rather than on every path to it. */
__noinline int scan(struct xdp_md *ctx, __u32 l4_off, __u32 l4_len, struct opt_locs *loc)
{
	if (!loc)
		return PARSE_MALFORMED;
	__builtin_memset(loc, 0, sizeof(*loc));
	return scan_options((void *)(long)ctx->data, (void *)(long)ctx->data_end, l4_off, l4_len,
			    loc, 0x3ff);
}

static __always_inline void report_key(const struct mps_lb_flow_key *k, __u32 backend,
				       const __u8 *opt)
{
	struct mps_lb_learn *e = bpf_ringbuf_reserve(&lb_learn, sizeof(*e), 0);
	if (!e) {
		count(MPS_LB_C_EVENTS_LOST);
		return;
	}
	e->backend = backend;
	e->family = k->family;
	e->pad[0] = e->pad[1] = e->pad[2] = 0;
	__builtin_memcpy(&e->server_key, opt + 12, 8); /* the receiver's key: the backend's */
	__builtin_memcpy(e->saddr, k->saddr, 16);
	__builtin_memcpy(e->daddr, k->daddr, 16);
	e->sport = k->sport;
	e->dport = k->dport;
	e->pad2 = 0;
	bpf_ringbuf_submit(e, 0);
	count(MPS_LB_C_KEYS_SEEN);
}

SEC("xdp")
int lb_ingress(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct mps_pkt_ctx pc = {};
	if (parse_packet(data, end, end - data, &pc))
		return XDP_PASS; /* not TCP, or not ours to judge: the stack decides */
	struct tcphdr *tcp = data + (pc.l4_off & 0x1ff);
	if ((void *)(tcp + 1) > end)
		return XDP_PASS;

	struct mps_lb_flow_key k = {.family = pc.family, .sport = tcp->source, .dport = tcp->dest};
	if (pc.family == 4) {
		struct iphdr *ip = data + (pc.l3_off & 0x3f);
		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		k.saddr[0] = ip->saddr;
		k.daddr[0] = ip->daddr;
	} else {
		struct ipv6hdr *ip6 = data + (pc.l3_off & 0x3f);
		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		__builtin_memcpy(k.saddr, &ip6->saddr, 16);
		__builtin_memcpy(k.daddr, &ip6->daddr, 16);
	}
	struct mps_lb_vip_key vk = {.family = pc.family, .port = tcp->dest};
	__builtin_memcpy(vk.addr, k.daddr, 16);
	struct mps_lb_vip *vip = bpf_map_lookup_elem(&lb_vips, &vk);
	if (!vip)
		return XDP_PASS;
	count(MPS_LB_C_PACKETS);

	__u32 syn = tcp->syn && !tcp->ack;
	struct mps_lb_flow *f = syn ? NULL : bpf_map_lookup_elem(&lb_flows, &k);
	/* The options matter on a SYN (MP_JOIN) and on the first packets after it that have more
	 * than a timestamp (MP_CAPABLE with both keys is 20 bytes or more). */
	struct opt_locs loc = {};
	__u32 hlen = tcp->doff * 4;
	__u32 probe = syn || (hlen > sizeof(*tcp) + 12 && (!f || f->probes));
	if (probe) {
		if (scan(ctx, pc.l4_off, pc.l4_len, &loc) < 0) {
			count(MPS_LB_C_MALFORMED);
			return XDP_DROP;
		}
	}

	if (syn) {
		struct mps_lb_flow entry = {.probes = MPS_LB_KEY_PROBES};
		__u32 joff = loc.off[OPT_JOIN];
		if (joff) {
			__u8 *o = (__u8 *)tcp + (joff & 0x3f);
			if ((void *)(o + 8) > end) {
				count(MPS_LB_C_MALFORMED);
				return XDP_DROP;
			}
			__u32 token;
			__builtin_memcpy(&token, o + 4, 4);
			token = bpf_ntohl(token);
			struct mps_lb_token *t = bpf_map_lookup_elem(&lb_tokens, &token);
			if (!t) {
				count(MPS_LB_C_JOINS_UNKNOWN);
				if (vip->unknown_token == MPS_LB_UNKNOWN_RESET)
					return reset(ctx, &pc);
				return XDP_DROP;
			}
			__sync_fetch_and_add(&t->joins, 1);
			entry.backend = t->backend;
			entry.token = token;
			entry.probes = 0; /* a join carries no keys */
			count(MPS_LB_C_JOINS_ROUTED);
		} else {
			entry.backend = hashed_backend(&k);
			count(MPS_LB_C_NEW_FLOWS);
		}
		/* A retransmitted SYN finds its entry again and keeps the backend it had, while
		 * that backend is still live. */
		struct mps_lb_flow *old = bpf_map_lookup_elem(&lb_flows, &k);
		struct mps_lb_backend *was =
		    old ? bpf_map_lookup_elem(&lb_backends, &old->backend) : NULL;
		if (old && !joff && was && (was->flags & MPS_LB_BACKEND_LIVE))
			entry.backend = old->backend;
		else if (entry.backend < MPS_LB_MAX_BACKENDS)
			bpf_map_update_elem(&lb_flows, &k, &entry, BPF_ANY);
		return forward(ctx, entry.backend);
	}

	__u32 backend;
	if (f) {
		backend = f->backend;
		count(MPS_LB_C_FLOW_HITS);
	} else {
		backend = hashed_backend(&k);
		count(MPS_LB_C_HASHED);
	}
	__u32 moff = loc.off[OPT_MPC];
	/* Both keys: lengths 20, 22 or 24 (scan_options() kept only well-formed ones). */
	if (moff && loc.len[OPT_MPC] >= 20 && !tcp->syn) {
		__u8 *o = (__u8 *)tcp + (moff & 0x3f);
		if ((void *)(o + 20) <= end)
			report_key(&k, backend, o);
	}
	if (probe && f && f->probes)
		f->probes = moff ? 0 : f->probes - 1;
	if (tcp->rst && f)
		bpf_map_delete_elem(&lb_flows, &k);
	return forward(ctx, backend);
}

/* For a veth whose peer is a redirect target (test beds): a veth accepts redirected frames
 * only while its peer runs an XDP program. A NIC needs none. */
SEC("xdp")
int lb_veth_peer(struct xdp_md *ctx)
{
	return XDP_PASS;
}
