/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The reset a host with no such connection answers a SYN with, and checksum folding: shared by
 * the reject actor (TC, through skb helpers) and the load balancer (XDP, in place).
 */
#ifndef MPSTEER_LIB_SYN_RESET_H
#define MPSTEER_LIB_SYN_RESET_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* A 64-bit one's complement sum (bpf_csum_diff's) folded to 16 bits. */
static __always_inline __u16 csum_fold32(__u64 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/*
 * The TCP header of the reset for `syn` (RFC 9293 3.10.7.1: RST+ACK, seq 0, ack = the SYN's
 * seq + 1 + its payload bytes, no options, window 0) into rst, its checksum complete. `from`
 * and `to` are the SYN's source and destination addresses (4 bytes for family 4, else 16);
 * ps (zeroed by the caller) receives the reply's pseudo header, whose first words are the
 * reply's addresses as the caller writes them: source (the SYN's destination) then
 * destination (ps[0..1] for IPv4, ps[0..7] for IPv6). Returns 0, or -1 when a checksum
 * helper failed.
 */
static __always_inline int syn_reset(const struct tcphdr *syn, __u32 payload, __u8 family,
				     const __u32 *from, const __u32 *to, struct tcphdr *rst,
				     __u32 ps[10])
{
	__builtin_memset(rst, 0, sizeof(*rst));
	rst->source = syn->dest;
	rst->dest = syn->source;
	rst->ack_seq = bpf_htonl(bpf_ntohl(syn->seq) + 1 + payload);
	rst->doff = 5;
	rst->rst = 1;
	rst->ack = 1;
	__s64 sum;
	if (family == 4) {
		ps[0] = to[0];
		ps[1] = from[0];
		ps[2] = bpf_htonl(IPPROTO_TCP << 16 | sizeof(*rst));
		sum = bpf_csum_diff(NULL, 0, ps, 12, 0);
	} else {
		__builtin_memcpy(ps, to, 16);
		__builtin_memcpy(ps + 4, from, 16);
		ps[8] = bpf_htonl(sizeof(*rst));
		ps[9] = bpf_htonl(IPPROTO_TCP);
		sum = bpf_csum_diff(NULL, 0, ps, 40, 0);
	}
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)rst, sizeof(*rst), (__u32)sum);
	if (sum < 0)
		return -1;
	rst->check = ~csum_fold32((__u64)sum);
	return 0;
}

#endif
