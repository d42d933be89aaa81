/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Events to the agent (the ring buffer in state_maps.h; layouts per type in abi.h).
 */
#ifndef MPSTEER_LIB_EVENTS_H
#define MPSTEER_LIB_EVENTS_H

#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"
#include "state_maps.h"
#include "slots.h"
#include "packet.h"

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

#endif
