/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The balancer's maps as bpf/lb.bpf.c and src/lb/balancer.cpp share them: an MPTCP-aware load
 * balancer at XDP on a balancer node. New connections go to a backend by a Maglev table slot
 * (the flow hash of src/lb/maglev.h); an MP_JOIN goes to the backend that owns its token; every
 * subflow's later packets follow the backend its SYN went to (an LRU entry, the hash when the
 * entry is gone). Forwarding is direct server return at L2: the backend's MAC written over the
 * frame's, the frame sent back out (XDP_TX) or to the backend's interface (redirect).
 */
#ifndef MPSTEER_LB_H
#define MPSTEER_LB_H

#include <linux/types.h>

#define MPS_LB_MAX_BACKENDS 256
#define MPS_LB_MAX_VIPS	    64
/* A table of at most this many slots (a prime); two of them, the agent fills the one not in
 * use and then switches (mps_lb_params.active), so no packet sees half a table. */
#define MPS_LB_TABLE_MAX    65537

/* A service: a VIP (IPv4 in addr[0]) and a TCP port (network order). */
struct mps_lb_vip_key {
	__u8 family; /* 4 or 6 */
	__u8 pad;
	__be16 port;
	__be32 addr[4];
};

enum mps_lb_unknown_action {
	MPS_LB_UNKNOWN_DROP = 0,  /* a join whose token no backend owns is dropped */
	MPS_LB_UNKNOWN_RESET = 1, /* ... answered with a reset, sent back to the client */
};

struct mps_lb_vip {
	__u8 unknown_token; /* enum mps_lb_unknown_action */
	__u8 pad[3];
};

#define MPS_LB_BACKEND_LIVE 0x1 /* forwards; a slot may name it only while it is live */

struct mps_lb_backend {
	__u8 mac[6];	 /* the backend's */
	__u8 src_mac[6]; /* the balancer's, on the interface the frame leaves by */
	__u32 ifindex;	 /* that interface */
	__u32 flags;	 /* MPS_LB_BACKEND_* */
};

/* Index 0 of the lb_params array. */
struct mps_lb_params {
	__u32 table_size; /* slots in each table (a prime <= MPS_LB_TABLE_MAX); 0: not set up */
	__u32 active;	  /* 0 or 1: which table new connections are hashed into */
};

/* One subflow as the client sent it (client address and port first). */
struct mps_lb_flow_key {
	__u8 family;
	__u8 pad[3];
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
};

struct mps_lb_flow {
	__u32 backend;
	__u32 token;  /* for a join: the token it was routed by; 0 for a connection's first */
	__u32 probes; /* non-SYN packets still to be searched for MP_CAPABLE's keys */
};

/* A client sends MP_CAPABLE with both keys on its third ACK, and again on its first data
 * segments until the server's data ACK comes: the first few packets after a SYN. Later ones
 * (and a join's) are not searched: their options cost nothing then. */
#define MPS_LB_KEY_PROBES 4

struct mps_lb_token {
	__u32 backend;
	__u32 pad;
	__u64 joins; /* joins routed by it */
};

/* A third ACK seen on its way to a backend: the server's key, for the agent to derive the
 * token (RFC 8684: the most significant 32 bits of SHA-256 of the key) and own it. */
struct mps_lb_learn {
	__u32 backend;
	__u8 family;
	__u8 pad[3];
	__u64 server_key; /* as in the option: network order */
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u32 pad2;
};

enum mps_lb_counter {
	MPS_LB_C_PACKETS = 0,	/* packets to a VIP */
	MPS_LB_C_NEW_FLOWS,	/* SYNs without MP_JOIN, hashed to a backend */
	MPS_LB_C_FLOW_HITS,	/* later packets that followed their subflow's entry */
	MPS_LB_C_HASHED,	/* later packets without an entry, hashed */
	MPS_LB_C_JOINS_ROUTED,	/* MP_JOIN SYNs sent to their token's backend */
	MPS_LB_C_JOINS_UNKNOWN, /* MP_JOIN SYNs whose token no backend owns */
	MPS_LB_C_KEYS_SEEN,	/* third ACKs reported to the agent */
	MPS_LB_C_EVENTS_LOST,	/* ... that did not fit in the ring */
	MPS_LB_C_NO_BACKEND,	/* packets with no live backend to go to: dropped */
	MPS_LB_C_MALFORMED,	/* packets to a VIP whose headers or options lie: dropped */
	MPS_LB_C_MAX
};

#endif
