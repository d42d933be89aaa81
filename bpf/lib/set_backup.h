/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * set_backup: NOP + MP_PRIO inserted into pure ACKs, and each direction's ACK kept as a template.
 */
#ifndef MPSTEER_LIB_SET_BACKUP_H
#define MPSTEER_LIB_SET_BACKUP_H

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
#include "flow.h"

/* Keeps the headers of this ACK-bearing packet as its subflow direction's template (see
 * prio_tmpl). Returns <0 only for a packet it cannot read. */
static __always_inline int record_template(void *ctx, bool xdp, const struct mps_pkt_ctx *pc,
					   __u16 at)
{
	struct mps_prio_tmpl_key k = {};
	struct tuple t;
	__u8 from_a;

	struct tcphdr *tcp = view_tcp(ctx, xdp, pc);
	if (!tcp)
		return -1;
	__u32 hlen = tcp->doff * 4;
	__u32 fin = tcp->fin;
	__u32 len = (pc->l4_off & 0x1ff) + hlen;
	if (len > MPS_PRIO_TMPL_HDR || hlen < 20 || pc->l4_len < hlen)
		return 0; /* e.g. stacked VLANs: no template, the datapath path alone */
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	flow_key(&t, pc->family, &k.flow, &from_a);
	k.dir = from_a ? 0 : 1;
	struct mps_prio_tmpl *v = bpf_map_lookup_elem(&prio_tmpl, &k);
	if (!v) {
		/* Insert, then write in place (no select between a stack and a map pointer). */
		struct mps_prio_tmpl fresh;
		__builtin_memset(&fresh, 0, sizeof(fresh));
		bpf_map_update_elem(&prio_tmpl, &k, &fresh, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&prio_tmpl, &k);
		if (!v)
			return 0;
	}
	/* 1 <= len <= 128 (checked above) as arithmetic the verifier follows: 6.1's narrows only
	 * the register a check ran on, not the copy clang keeps on the stack across the map calls.
	 */
	_Static_assert(MPS_PRIO_TMPL_HDR == 128, "the mask below");
	len = verifier_mask(len - 1, 0x7f) + 1;
	long r =
	    xdp ? bpf_xdp_load_bytes(ctx, 0, v->hdr, len) : bpf_skb_load_bytes(ctx, 0, v->hdr, len);
	if (r)
		return 0;
	v->ns = bpf_ktime_get_ns();
	v->ifindex =
	    xdp ? ((struct xdp_md *)ctx)->ingress_ifindex : ((struct __sk_buff *)ctx)->ifindex;
	v->pc = at;
	v->hook = pc->hook;
	v->family = pc->family;
	v->l3_off = pc->l3_off;
	v->l4_off = pc->l4_off;
	v->len = len;
	v->next = pc->l4_len - hlen + fin;
	return 0;
}

static __always_inline int act_set_backup(void *ctx, bool xdp, struct mps_pkt_ctx *pc,
					  const struct mps_step *st)
{
	struct tuple t;
	struct mps_flow_key k;
	__u8 from_a;

	if (ensure_scanned(ctx, xdp, pc))
		return -1;
	if ((pc->kinds & (MPS_K_SYN | MPS_K_RST | MPS_K_ACK)) == MPS_K_ACK &&
	    record_template(ctx, xdp, pc, pc->pc))
		return -1;
	/* Pure ACKs only: a control packet, never a data segment or a GSO super-packet. */
	if ((pc->kinds & (MPS_K_SYN | MPS_K_FIN | MPS_K_RST | MPS_K_ACK | MPS_K_PAYLOAD)) !=
	    MPS_K_ACK)
		return 0;
	if (pc->kinds & MPS_K_MP_PRIO)
		return 0;
	if (load_tuple(ctx, xdp, pc, &t))
		return -1;
	flow_key(&t, pc->family, &k, &from_a);
	__u8 bk = st->p.backup.backup ? 1 : 0;
	__u32 d = from_a ? 0 : 1;
	struct mps_prio_sent *ps = bpf_map_lookup_elem(&prio_sent, &k);
	if (ps && !st->p.backup.every_packet && ps->sent[d & 1] == bk + 1)
		return 0;
	__u8 add[4] = {1 /* NOP */, TCPOPT_MPTCP, 3, (OPT_PRIO << 4) | bk};
	int r = insert_opt4(ctx, xdp, pc, add);
	if (r <= 0)
		return r;
	pc->kinds |= MPS_K_MP_PRIO | MPS_K_ANY_MPTCP;
	if (!ps) {
		struct mps_prio_sent z = {};
		bpf_map_update_elem(&prio_sent, &k, &z, BPF_NOEXIST);
		ps = bpf_map_lookup_elem(&prio_sent, &k);
	}
	if (ps) {
		ps->sent[d & 1] = bk + 1;
		ps->ns[d & 1] = bpf_ktime_get_ns();
	}
	return 1;
}

#endif
