// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Control programs the agent runs with BPF_PROG_TEST_RUN (never attached): field-wise updates
 * of shared state that the datapath writes concurrently. A whole-value map update from
 * userspace would overwrite counters the datapath added between the agent's read and write.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "mpsteer/abi.h"
#include "lib/state_maps.h" /* the pinned maps the agent reuses (used here: flows, conns) */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Input: one struct mps_ctl_flow_req as the frame. XDP_PASS: updated; XDP_DROP: no such
 * flow; XDP_ABORTED: short request. */
SEC("xdp")
int ctl_flow_update(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct mps_ctl_flow_req r;
	if (data + sizeof(r) > end)
		return XDP_ABORTED;
	__builtin_memcpy(&r, data, sizeof(r));
	struct mps_flow *f = bpf_map_lookup_elem(&flows, &r.key);
	if (!f)
		return XDP_DROP;
	if (r.set & MPS_CTL_TOKENS) {
		if (r.token[0])
			f->token[0] = r.token[0];
		if (r.token[1])
			f->token[1] = r.token[1];
	}
	if (r.set & MPS_CTL_IDSN) {
		if (r.idsn[0])
			f->idsn[0] = r.idsn[0];
		if (r.idsn[1])
			f->idsn[1] = r.idsn[1];
	}
	if (r.set & MPS_CTL_CONN)
		f->conn_token = r.conn_token;
	if (r.set & MPS_CTL_RATE)
		f->rate_bps = r.rate_bps;
	if (r.set & MPS_CTL_SUBFLOW) {
		__u32 tok = r.conn_token;
		struct mps_conn *c = bpf_map_lookup_elem(&conns, &tok);
		if (c)
			__sync_fetch_and_add(&c->subflows, 1);
	}
	return XDP_PASS;
}
