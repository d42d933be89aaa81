/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * no_subflows: the MP_CAPABLE C flag set on a SYN or SYN/ACK.
 */
#ifndef MPSTEER_LIB_NO_SUBFLOWS_H
#define MPSTEER_LIB_NO_SUBFLOWS_H

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

static __always_inline int act_no_subflows(void *ctx, bool xdp, struct mps_pkt_ctx *pc)
{
	struct opt_locs locs;
	__u32 len;

	if (scan(ctx, xdp, pc, &locs))
		return -1;
	if ((pc->kinds & (MPS_K_MP_CAPABLE | MPS_K_SYN)) != (MPS_K_MP_CAPABLE | MPS_K_SYN))
		return 0;
	__u8 *o = opt_ptr(ctx, xdp, pc, &locs, OPT_MPC, 4, &len);
	if (!o || (o[2] & 0x0f) != 1) /* the C flag exists in MPTCP v1 only */
		return 0;
	if (o[3] & MPC_FLAG_C)
		return 0;
	int r = tcp_mod8(ctx, xdp, pc, locs.off[OPT_MPC] + 3, 0xff, MPC_FLAG_C, 0);
	return r < 0 ? r : 1;
}

#endif
