/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The ABI between the BPF datapath and the agent: map layouts, the step table, events and
 * counters. Included by BPF C (clang -target bpf) and by C++; src/datapath/abi_check.cpp
 * pins the size and every field offset of each struct here, so a layout change fails the
 * build until that file (and MPS_STATE_LAYOUT, for a shared map) says it is meant.
 * Numeric values are stable: append, never renumber. The protocol is described in
 * bpf/README.md.
 *
 * Sections: sizes and versions; hooks and prog-array slots; the per-packet context; steps;
 * generations (tables and slots); counters; shared state (flows, connections); events; the
 * option-rewriting actors' state; control requests.
 */
#ifndef MPSTEER_ABI_H
#define MPSTEER_ABI_H

#include <linux/types.h>

/* ---- sizes and versions -------------------------------------------------------------------
 * The shared maps outlive a generation, a load of the BPF object and the agent itself, so
 * their layout is versioned: a changed layout gets maps of its own instead of misreading old
 * entries. */

/* Bumped whenever a shared (cross-generation) map changes layout; pinned names carry it. */
#define MPS_STATE_LAYOUT 4

/* The shared hash maps are sized by the agent when it creates them (TableSizes in
 * src/datapath/datapath.h); every load reuses them, so the objects' own sizes are placeholders. */
#define MPS_TABLE_PLACEHOLDER 1024
#define MPS_EVENTS_BYTES      (256 * 1024)

/* ---- hooks and prog-array slots -----------------------------------------------------------
 * A step names its program by enum value, and that value is its slot in the prog arrays
 * (jmp_xdp / jmp_tc), so reaching a program is a constant-index tail call (a direct jump).
 * Slot layout: 0 the interpreter, 1..47 the programs below, MPS_JMP_ENTRY + hook the entry
 * programs, MPS_JMP_PREFLIGHT + hook their preflight twins; all below MPS_PROG_MAX (checked
 * in abi_check.cpp). */

/* Hooks; index of the entry table. */
enum mps_hook {
	MPS_HOOK_XDP = 0,
	MPS_HOOK_TC_EGRESS = 1,
	MPS_HOOK_TC_INGRESS = 2,
	MPS_HOOK_MAX = 3,
};

/* Every step program, one row each:
 *   X(ENUM, value, name, inline, options)
 * value: the step's prog and its slot in the prog arrays (never renumber; selectors below
 * MPS_ACT_PASS, actors from it); name: "sel_<x>" / "act_<x>", the manifest's key after the
 * prefix, and its programs are name_xdp / name_tc; inline: 1 when the interpreter (and a
 * compiled entry) runs it itself, 0 when it is a program of its own, reached by a
 * constant-index tail call; options: 1 when its program reads the packet's TCP options (the
 * build without kernel BTF walks them first). Generated from it: enum mps_prog, the
 * interpreter's inline test and tail-call switch (bpf/lib/steps.h, interp.h), the names,
 * has_program() and reads_options() (src/datapath), the compiler's actor map (src/compile). */
#define MPS_PROGRAMS(X)                                                                            \
	/* selectors */                                                                            \
	X(MPS_SEL_MATCH, 1, sel_match, 1, 0) /* every inline selector: struct mps_p_match */       \
	X(MPS_SEL_TOKEN, 7, sel_token, 0, 0)                                                       \
	X(MPS_SEL_SEQUENCE, 8, sel_sequence, 0, 1)                                                 \
	X(MPS_SEL_FLOW_BYTES, 9, sel_flow_bytes, 0, 1)                                             \
	/* actors */                                                                               \
	X(MPS_ACT_PASS, 32, act_pass, 1, 0)                                                        \
	X(MPS_ACT_DROP, 33, act_drop, 1, 0)                                                        \
	X(MPS_ACT_RECORD, 34, act_record, 0, 1)                                                    \
	X(MPS_ACT_GET_CONNECT, 35, act_get_connect, 0, 1)                                          \
	X(MPS_ACT_GET_SUBFLOW, 36, act_get_subflow, 0, 1)                                          \
	X(MPS_ACT_RATE_LIMIT, 37, act_rate_limit, 0, 1)                                            \
	/* option-rewriting actors (bpf/lib/rewrite.h and its actors) */                           \
	X(MPS_ACT_BLK_SUBFLOW, 38, act_blk_subflow, 0, 1) /* hide ADD_ADDR, store it */            \
	X(MPS_ACT_ADD_SUBFLOW, 39, act_add_subflow, 0, 1) /* re-inject a stored ADD_ADDR */        \
	X(MPS_ACT_SET_BACKUP, 40, act_set_backup, 0, 1)	  /* insert MP_PRIO B=1 / B=0 */           \
	X(MPS_ACT_NO_SUBFLOWS, 41, act_no_subflows, 0, 1) /* MP_CAPABLE "C" on the SYN/ACK */      \
	X(MPS_ACT_REDIRECT, 42, act_redirect, 0, 0)	  /* out of another interface */           \
	X(MPS_ACT_REJECT, 43, act_reject, 0, 0)		  /* a reset for a SYN, the way it came */

/* What a step runs: one selector or actor program (XDP and TC variants) each (not formatted:
 * clang-format indents what follows a macro's expansion). */
/* clang-format off */
enum mps_prog {
	MPS_PROG_NONE = 0,
#define MPS_PROG_ENUM(e, value, name, inl, options) e = value,
	MPS_PROGRAMS(MPS_PROG_ENUM)
#undef MPS_PROG_ENUM
	MPS_PROG_MAX = 64,
};
/* clang-format on */
#define MPS_PROG_IS_ACTOR(p) ((p) >= MPS_ACT_PASS)

/* Where a compiled entry (a chain emitted as a program of its own, src/datapath/
 * entry_emitter.cpp) hands what it does not take (another generation, SYNs, IPv6, VLAN, IP
 * options, anything malformed): jmp_*[MPS_JMP_ENTRY + hook] is entry_*,
 * jmp_*[MPS_JMP_PREFLIGHT + hook] preflight_*. */
#define MPS_JMP_ENTRY	  48
#define MPS_JMP_PREFLIGHT 52
/* The datapath built without kernel BTF walks options in a program of its own
 * (bpf/datapath.bpf.c, opt_walk_*): jmp_*[MPS_JMP_OPT_WALK] is that program. */
#define MPS_JMP_OPT_WALK  56

/* ---- the per-packet context ---------------------------------------------------------------
 * What one program of a chain tells the next across a tail call. It must fit where the kernel
 * lets it travel: XDP data_meta, TC skb->cb (20 bytes at most). */

/* Packet kinds found by the option walk (packet_type selector mask and ctx->kinds).
 * The MPTCP bits are 1 << subtype, which keeps the walk branch-free for the verifier. */
enum mps_kind {
	MPS_K_MP_CAPABLE = 1u << 0,
	MPS_K_MP_JOIN = 1u << 1,
	MPS_K_DSS = 1u << 2,
	MPS_K_ADD_ADDR = 1u << 3,
	MPS_K_REMOVE_ADDR = 1u << 4,
	MPS_K_MP_PRIO = 1u << 5,
	MPS_K_MP_FAIL = 1u << 6,
	MPS_K_FASTCLOSE = 1u << 7,
	MPS_K_MP_TCPRST = 1u << 8,
	MPS_K_DATA_ACK = 1u << 9,  /* DSS with the A flag */
	MPS_K_DATA_FIN = 1u << 10, /* DSS with the F flag */
	MPS_K_ANY_MPTCP = 1u << 11,
	MPS_K_PLAIN_TCP = 1u << 12, /* TCP without any MPTCP option */
	MPS_K_SYN = 1u << 13,
	MPS_K_FIN = 1u << 14,
	MPS_K_RST = 1u << 15,
	MPS_K_ACK = 1u << 16,
	MPS_K_PAYLOAD = 1u << 17,   /* TCP payload length > 0 */
	MPS_K_TIMESTAMP = 1u << 18, /* carries the TCP timestamp option */
};

struct mps_pkt_ctx {
	__u16 pc;     /* step being executed */
	__u8 hops;    /* tail calls taken so far */
	__u8 flags;   /* MPS_CTXF_* */
	__u8 family;  /* 4 or 6 */
	__u8 hook;    /* enum mps_hook */
	__u16 l3_off; /* from the start of the frame */
	__u16 l4_off;
	__u16 l4_len;  /* TCP header + payload bytes in this packet (from the IP length) */
	__u32 kinds;   /* MPS_K_*, valid when MPS_CTXF_SCANNED */
	__u32 scratch; /* free for steps to pass data along the chain */
};
#define MPS_CTXF_SCANNED   0x01 /* option walk done, kinds valid, options well-formed */
#define MPS_CTXF_ACCOUNTED 0x02 /* flow counters already updated for this packet */
#define MPS_CTXF_SLOT1	   0x04 /* the packet runs the generation in table slot 1 */
#define MPS_CTXF_WALKED	   0x08 /* built without kernel BTF: the walk is in opt_walks */
#define MPS_CTXF_LEARN_SYN 0x10 /* built without kernel BTF: the walk program learns this SYN */

/* ---- steps --------------------------------------------------------------------------------
 * A chain is a table of steps; AND, OR and NOT are branch targets (on_match / on_miss), so
 * there are no combinator steps. Parameters are a union of fixed size so a step is 128 bytes
 * and a pc indexes the table directly. Addresses in network byte order, ports in host order. */

#define MPS_MAX_STEPS 1024 /* steps per table slot (a power of two: pcs are masked) */
#define MPS_MAX_CHAIN                                                                              \
	32		  /* steps on any path (the loader checks; the interpreter cuts            \
			   * longer inline runs); program steps on a path: at most 16, each        \
			   * costs two of the kernel's 33 tail calls */
#define MPS_PC_END 0xffff /* "no next step": the chain ends, the packet passes */

/*
 * The one inline selector. Every selector the interpreter and the compiled entries run
 * themselves (src, dst, subflow, ip_pair, port, packet_type, ttl, dscp) is lowered by the
 * compiler to this: up to MPS_MATCH_TESTS tests on words of the packet's match tuple, all of
 * which must hold, each  lo <= (word & mask) <= hi  (unsigned). With MPS_MATCHF_EITHER the step
 * also matches when they all hold on the tuple seen the other way round: word ^ MPS_W_SWAP, the
 * source and destination exchanged.
 */
enum mps_word {
	MPS_W_SRC = 0,	  /* 0..3: source address words, as on the wire (IPv4: word 0, 1..3 zero) */
	MPS_W_DST = 4,	  /* 4..7: destination address words */
	MPS_W_SPORT = 8,  /* source port */
	MPS_W_PORTS = 9,  /* source port << 16 | destination port */
	MPS_W_KINDS = 10, /* MPS_K_* of the packet (the option walk runs first) */
	MPS_W_IP = 11,	  /* traffic class (TOS) << 8 | TTL (hop limit) */
	MPS_W_DPORT = 12, /* destination port */
	MPS_W_PORTS_REV = 13, /* destination port << 16 | source port */
	/* 14, 15: KINDS and IP again, so that every word has its swap */
	MPS_W_MAX = 16,
};
#define MPS_W_SWAP	  4 /* word ^ MPS_W_SWAP: the same word with source and destination exchanged */
#define MPS_MATCH_TESTS	  9    /* an IPv6 subflow: eight address words and the ports */
#define MPS_MATCHF_EITHER 0x01 /* also the tuple the other way round */
/* What the tests read beyond the addresses and ports (set with the tests; the loader checks):
 * the interpreter takes the option walk, or reads the IP header's word, only for such a step. */
#define MPS_MATCHF_KINDS  0x02 /* a test reads MPS_W_KINDS */
#define MPS_MATCHF_IP	  0x04 /* a test reads MPS_W_IP */
#define MPS_FAMILY_V4	  0x01
#define MPS_FAMILY_V6	  0x02
struct mps_p_match {
	__u8 families;		    /* MPS_FAMILY_*: the packets it may match */
	__u8 flags;		    /* MPS_MATCHF_* */
	__u8 n;			    /* tests used, 1..MPS_MATCH_TESTS */
	__u8 word[MPS_MATCH_TESTS]; /* enum mps_word */
	__u32 mask[MPS_MATCH_TESTS];
	__u32 lo[MPS_MATCH_TESTS];
	__u32 hi[MPS_MATCH_TESTS];
};
struct mps_p_token {
	__u32 token; /* as printed by the kernel (host order of the big-endian hash word) */
};
enum mps_seq_kind { MPS_SEQ_SUBFLOW = 0, MPS_SEQ_DATA = 1 };
struct mps_p_seq {
	__u8 kind; /* enum mps_seq_kind; relative to the ISN / IDSN */
	__u8 pad[7];
	__u64 lo, hi; /* [lo, hi) */
};
enum mps_bytes_scope { MPS_BYTES_SUBFLOW = 0, MPS_BYTES_CONN = 1 };
struct mps_p_bytes {
	__u8 scope; /* enum mps_bytes_scope */
	__u8 pad[7];
	__u64 lo, hi; /* [lo, hi) bytes seen before this packet */
};
struct mps_p_rate {
	__u64 bytes_per_sec; /* default cap; a per-subflow value in the flow map wins */
	__u32 rtt_us;	     /* used when no RTT sample exists (0: leave the window alone) */
	__u32 min_window;    /* bytes: the credit an idle subflow builds up is at least this */
};
struct mps_p_backup {
	__u8 backup;	   /* B flag to signal */
	__u8 every_packet; /* 0: once per subflow (default), 1: on every selected packet */
};
/* add_subflow: with on_bytes, re-inject on its own once the connection has carried
 * after_bytes payload bytes (record's count, the packet at hand included). */
struct mps_p_add {
	__u8 on_bytes;
	__u8 pad[7];
	__u64 after_bytes;
};
struct mps_p_redirect {
	__u32 ifindex; /* filled by the loader from the interface name */
};

union mps_param {
	struct mps_p_match match;
	struct mps_p_token token;
	struct mps_p_seq seq;
	struct mps_p_bytes bytes;
	struct mps_p_rate rate;
	struct mps_p_backup backup;
	struct mps_p_add add;
	struct mps_p_redirect redirect;
	__u8 raw[120];
};

struct mps_step {
	__u8 prog;	/* enum mps_prog */
	__u8 flags;	/* MPS_STEPF_* */
	__u16 on_match; /* next pc, MPS_PC_END ends */
	__u16 on_miss;	/* next pc for selectors, ignored by actors */
	__u16 policy;	/* index into the generation's policy table (counters) */
	union mps_param p;
};
#define MPS_STEPF_FAIL_DROP 0x01 /* failure mode: drop instead of pass on a missed tail call */
/* Set by the loader (never by the compiler): a step with MPS_STEPF_FAIL_DROP is reachable from
 * here, so a packet that cannot be parsed (malformed TCP options, an IP fragment) is dropped
 * rather than passed around the guard. */
#define MPS_STEPF_GUARDED   0x02

/* ---- generations: tables and slots --------------------------------------------------------
 * A generation is data, not programs: the contents of one of two table slots. Switching is
 * one store to the live word, so every hook changes at once and a rollback is another store. */

#define MPS_SLOTS 2 /* table slots: the live generation and the one being staged */

/* Where each hook's chain starts. */
struct mps_entry {
	__u16 pc;    /* MPS_PC_END: no policy on this hook */
	__u16 flags; /* MPS_ENTRYF_PER_IFACE: iface_entries first, pc when absent */
	__u32 gen;   /* generation number, for events */
};
#define MPS_ENTRYF_PER_IFACE 0x1
/* Where no chain starts, the entry still learns SYNs (and FIN/RST) into the flow table: a
 * rate_limit on the other direction needs the window scale both sides announced. */
#define MPS_ENTRYF_LEARN     0x2
struct mps_iface_key { /* iface_entries (HASH) -> __u16 pc */
	__u32 ifindex;
	__u16 hook;
	__u16 slot;
};
#define MPS_IFACE_ENTRIES_MAX 512

/* A generation: the contents of one table slot. */
struct mps_table {
	struct mps_entry entries[MPS_HOOK_MAX + 1]; /* one spare: 8-byte aligned steps */
	struct mps_step steps[MPS_MAX_STEPS];
};
/* The global `mps_slots` (.bss, mmapped by the agent): which slot packets run, which one the
 * preflight entries run, and the slots. `active` is the live word: bit 0 the slot, the rest an
 * epoch that changes whenever compiled entries of that slot are emitted again. */
struct mps_slots {
	__u32 active;
	__u32 staged;
	__u32 testing; /* live word a compiled entry runs under during its pre-flight (0: none) */
	__u32 pad;
	struct mps_table tables[MPS_SLOTS];
};

/* ---- counters -----------------------------------------------------------------------------
 * Per-CPU arrays, one block per slot, zeroed when a generation is written there: counting
 * needs no atomics and a generation's counters start from zero. */

/* Per-step counters (PERCPU_ARRAY, MPS_SLOTS * MPS_MAX_STEPS; index slot * MPS_MAX_STEPS + pc). */
struct mps_step_counters {
	__u64 runs;    /* packets that executed the step */
	__u64 matched; /* selector matched / actor applied */
	__u64 drops;
	__u64 missed_tail_calls; /* the jump out of this step failed */
};
/* Per-generation counters (PERCPU_ARRAY, MPS_SLOTS * MPS_GC_MAX; index slot * MPS_GC_MAX + c). */
enum mps_gen_counter {
	MPS_GC_PACKETS = 0, /* entered a hook that has a chain */
	MPS_GC_NOT_TCP = 1,
	MPS_GC_MALFORMED = 2, /* passed untouched, or dropped under a guard */
	MPS_GC_MISSED_TAIL_CALL = 3,
	MPS_GC_CHAIN_TOO_LONG = 4,
	MPS_GC_EVENTS_LOST = 5,	      /* ring buffer full */
	MPS_GC_UNPARSEABLE_DROPS = 6, /* malformed or fragment, dropped: MPS_STEPF_GUARDED */
	MPS_GC_MAX = 7,
};

/* rate_limit rates in bytes/s, the manifest's range (1 kbit/s .. 400 Gbit/s): rates from
 * anywhere else (Lua, the control requests) are clamped to it. */
#define MPS_RATE_MIN	    125ull
#define MPS_RATE_MAX	    50000000000ull
/* rate_limit lets a subflow send up to a right edge that moves at the rate with time, at most
 * max(2 x rate x RTT, min_window, this long at the rate) ahead of what it acknowledged (the
 * credit an idle subflow keeps: a token bucket's depth), and never more than
 * MPS_RATE_WINDOW_MAX. The depth outlasts the wait of a peer stopped at the edge: it probes
 * after its RTO (>= 200 ms), then after twice that, and Linux answers a probe at most every
 * 500 ms (tcp_invalid_ratelimit), so the answer may come ~650 ms after the stop; a shallower
 * bucket loses what the subflow was owed meanwhile (300 ms: 58 % below 5 Mbit/s on a 0.1 ms
 * path). */
#define MPS_RATE_BURST_MS   1000ull
#define MPS_RATE_WINDOW_MAX (1ull << 30) /* the largest window a scale of 14 can say */

/* ---- shared state: flows and connections --------------------------------------------------
 * LRU_HASH maps shared across generations (pinned by the agent as "<name>_v<MPS_STATE_LAYOUT>",
 * defined once for both BPF objects in bpf/lib/state_maps.h). */

/* Entries the datapath added to a state table (PERCPU_ARRAY "table_inserts", __u64 per CPU),
 * and the flows the agent removed itself (its pre-flight packet's; written by the agent only).
 * Nothing else deletes from these LRU tables, so the agent derives evictions as inserts minus
 * removals minus the entries present. */
enum mps_table_counter {
	MPS_TI_FLOWS = 0,
	MPS_TI_ANNOUNCES = 1,
	MPS_TI_FLOWS_REMOVED = 2,
	MPS_TI_MAX = 3,
};

/* Flow state, keyed by the subflow 4-tuple with the lower (address, port) first so both
 * directions find the same entry. */
struct mps_flow_key {
	__u32 a[4];
	__u32 b[4];
	__u16 port_a, port_b; /* host order */
	__u8 family;
	__u8 pad[3];
};
/* One direction's state: 0 = packets from a to b, 1 = from b to a. */
struct mps_flow_dir {
	__u64 packets;
	__u64 bytes;  /* TCP payload bytes */
	__u32 isn;    /* from this side's SYN */
	__u32 ts_val; /* last TSval sent, waiting for its echo */
	__u64 ts_sent_ns;
	__u8 wscale;	   /* this side's advertised window shift (from its SYN) */
	__u8 wscale_known; /* this side's SYN seen */
	__u8 wscale_sent;  /* ... and it carried the window scale option */
	__u8 pad[5];
};
/* The two directions sit 88 bytes apart, never in one cache line: a host's egress and
 * ingress programs often run on different CPUs, and in one line each direction's counter
 * writes would take the line from the other CPU. Between them the fields written once or
 * rarely, those the programs read first. Index a direction with MPS_FLOW_DIR(). */
struct mps_flow {
	struct mps_flow_dir dir_ab;
	__u64 last_ns;	  /* to the clock tick (the coarse clock) */
	__u32 conn_token; /* key of the connection entry (the lower token; 0: unknown) */
	__u32 srtt_us;	  /* smoothed RTT from timestamps (0: no sample) */
	__u32 rttvar_us;
	__u32 ended;	/* MPS_FLOW_FIN_A | MPS_FLOW_FIN_B | MPS_FLOW_CLOSED (atomic: 32 bits) */
	__u64 rate_bps; /* per-subflow rate_limit override in bytes/s (0: use the step's) */
	__u8 role;	/* enum mps_role */
	__u8 backup;
	__u8 pad[2];
	/* Address ids 0..31 blk_subflow hid on this subflow and no carrier released yet (bit n:
	 * id n): what add_subflow's after_bytes re-injects. */
	__u32 hidden_ids;
	__u64 first_ns; /* to the clock tick (the coarse clock) */
	__u64 key[2];	/* MP_CAPABLE key of side a / b as on the wire (0: unseen) */
	__u64 idsn[2];	/* IDSN of side a / b, filled by the agent from the keys */
	__u32 token[2]; /* token of side a / b (0: unknown) */
	struct mps_flow_dir dir_ba;
	/* Of both directions' counters, what the connection entry (conn_token) holds: the
	 * datapath adds the rest once per clock tick and at a FIN or RST, not per packet, so a
	 * connection's exact count is its entry's plus each linked flow's counters minus these. */
	__u64 conn_packets, conn_bytes;
	/* rate_limit's right edge per direction of the window (rate_window()): how far the peer
	 * may send (a sequence number) as of rate_edge_ns (0: not set), and the credit the edge
	 * was last capped to. In the flow entry so rate_limit finds it with the flow record
	 * looked up, not with a lookup of its own. */
	__u64 rate_edge_ns[2];
	__u32 rate_edge[2];
	__u32 rate_most[2];
};
/* A pointer to direction d (0: a to b, 1: b to a) of the flow f points to. */
#define MPS_FLOW_DIR(f, d)  ((d) ? &(f)->dir_ba : &(f)->dir_ab)
/* Both directions' counts of the flow f points to. */
#define MPS_FLOW_PACKETS(f) ((f)->dir_ab.packets + (f)->dir_ba.packets)
#define MPS_FLOW_BYTES(f)   ((f)->dir_ab.bytes + (f)->dir_ba.bytes)
enum mps_role { MPS_ROLE_UNKNOWN = 0, MPS_ROLE_INITIAL = 1, MPS_ROLE_JOIN = 2 };
/* How a flow ended: a FIN from each side, or a RST, closes it (MPS_EV_FLOW_CLOSED, once). A
 * closed flow keeps its entry until the LRU needs the room or a SYN starts the 4-tuple again. */
#define MPS_FLOW_FIN_A	0x01
#define MPS_FLOW_FIN_B	0x02
#define MPS_FLOW_CLOSED 0x04

/* Connection state, created by the agent when it derives the tokens from the keys. The entry
 * under the lower token holds the counters (its linked flows' as of their last clock tick, see
 * mps_flow.conn_bytes); the one under the higher token is an alias (its key differs from
 * token[0]) so either token finds it. */
struct mps_conn {
	__u64 packets, bytes;
	__u64 first_ns, last_ns; /* to the clock tick (the coarse clock) */
	__u32 token[2];		 /* both tokens, lower first */
	__u32 subflows;
	__u32 pad;
#ifdef MPS_ABI_LAYOUT_PROBE
	__u32 layout_probe; /* only in the test that proves abi_check.cpp catches a change */
#endif
};

/* ---- events -------------------------------------------------------------------------------
 * One RINGBUF shared across generations. State is stored in the maps before an event is
 * reserved, so a full ring loses a notification, never state. */
enum mps_event_type {
	MPS_EV_MP_CAPABLE = 1,	     /* keys seen: agent derives tokens and fills flows/conns */
	MPS_EV_MP_JOIN = 2,	     /* MP_JOIN SYN: token of the receiver, nonce */
	MPS_EV_FLOW_CLOSED = 3,	     /* FIN from both sides or a RST */
	MPS_EV_ADD_ADDR_BLOCKED = 4, /* an ADD_ADDR hidden by blk_subflow (its first copy) */
	MPS_EV_MAX = 5,
};

/* Every event has type, gen, ts_ns, flow, from_a and hook; what the rest holds per type:
 *   MP_CAPABLE        version, flags = the option's flags byte, key[0] = the sender's key,
 *                     key[1] = the receiver's key (0 if absent)
 *   MP_JOIN           flags bit 0 = the B flag, addr_id, token = the receiver's token, nonce
 *   FLOW_CLOSED       flags = 1 for a RST
 *   ADD_ADDR_BLOCKED  addr_id, flags = address family (4 or 6), nonce = port (0: none),
 *                     key[0..1] = the 16 address bytes (IPv4 in the first 4); the whole option
 *                     (with its HMAC) is in the announces map, which keeps it when the ring is
 *                     full
 * Userspace decodes them in one place (src/datapath/events.cpp, decode()). */
struct mps_event {
	__u32 type;
	__u32 gen;
	__u64 ts_ns;
	struct mps_flow_key flow;
	__u8 from_a; /* packet travelled from a to b */
	__u8 hook;
	__u8 version; /* MPTCP version (MP_CAPABLE) */
	__u8 flags;   /* MP_CAPABLE flags byte, MP_JOIN B flag */
	__u8 addr_id;
	__u8 pad[3];
	__u32 token; /* MP_JOIN: receiver's token */
	__u32 nonce;
	__u64 key[2]; /* MP_CAPABLE: sender's key, receiver's key (0 if absent) */
};

/* ---- the option-rewriting actors' state (bpf/lib/rewrite.h; src/datapath/actors.h) --------
 * Memory the actors keep between packets and hand to userspace: announcements hidden,
 * add_subflow requests, what set_backup signalled, and its packet templates. */

/* Announcements hidden by blk_subflow, per connection: LRU_HASH keyed by the subflow the
 * ADD_ADDR travelled on and its address id (shared, pinned as "announces_v<layout>"). */
struct mps_announce_key {
	struct mps_flow_key flow;
	__u8 addr_id;
	__u8 pad[3];
};
enum mps_announce_state {
	MPS_ANN_BLOCKED = 0,   /* hidden: every copy (retransmission) is hidden too */
	MPS_ANN_PENDING = 1,   /* add_subflow requested: the next packet on the flow carries it */
	MPS_ANN_INJECTING = 2, /* a copy of a packet is being turned into the carrier */
	MPS_ANN_RELEASED = 3,  /* delivered to the host; later copies pass untouched */
};
struct mps_announce {
	__u64 first_ns, last_ns; /* first / latest copy hidden */
	__u64 released_ns;	 /* carrier built (0: not yet) */
	__u32 state;		 /* enum mps_announce_state, changed with compare-and-swap */
	__u32 hidden;		 /* copies hidden (the first plus the retransmissions) */
	__u32 conn_token;	 /* the flow's connection (0: unknown when first hidden) */
	__u8 from_a;		 /* the ADD_ADDR travelled from a to b of the flow key */
	__u8 hook;		 /* enum mps_hook where it was hidden */
	__u8 family;		 /* of the announced address: 4 or 6 */
	__u8 len;		 /* option length: 16/18 (IPv4), 28/30 (IPv6) */
	__u16 port;		 /* host order; 0: no port in the option */
	__u8 pad[2];
	__u32 addr[4]; /* network order */
	__u8 opt[32];  /* the option as it was on the wire, HMAC intact */
	__u8 pad2[4];
};

/* add_subflow commands: HASH keyed by the flow key of the announcement; the value names the
 * address id. Written by userspace (request_add_subflow), consumed by the datapath. */
struct mps_add_request {
	__u8 addr_id;
	__u8 pad[7];
	__u64 requested_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) of the request */
};

/* set_backup's one-shot memory: LRU_HASH keyed by the flow key. sent[d] is 0 (nothing sent),
 * 1 (B=0 sent) or 2 (B=1 sent) for direction d (0: from a to b). */
struct mps_prio_sent {
	__u8 sent[2];
	__u8 pad[6];
	__u64 ns[2];
};

/* set_backup's packet templates (LRU_HASH "prio_tmpl", per loaded datapath): per subflow and
 * direction, the headers (L2 + IP + TCP with options) of the latest ACK-bearing packet the
 * actor saw, with its payload length, so userspace (ActorMaps::signal_prio) can send the pure
 * ACK that would follow it, carrying MP_PRIO, on a subflow that has gone idle: after B=1
 * moved the data off a subflow nobody sends on it any more, and B=0 would have no packet to
 * ride on. Linux ignores MP_PRIO with an address id (length 4) and applies a length-3 MP_PRIO
 * to the subflow it arrives on (options.c, mptcp_pm_mp_prio_received), so a sibling's packets
 * cannot carry it. */
#define MPS_PRIO_TMPL_HDR 128
struct mps_prio_tmpl_key {
	struct mps_flow_key flow;
	__u8 dir; /* 0: from a to b (as mps_prio_sent.sent[]) */
	__u8 pad[3];
};
struct mps_prio_tmpl {
	__u64 ns;	      /* bpf_ktime_get_ns() of the packet */
	__u32 ifindex;	      /* where it was seen */
	__u16 pc;	      /* the set_backup step that saw it */
	__u8 hook;	      /* enum mps_hook */
	__u8 family;	      /* 4 or 6 */
	__u16 l3_off, l4_off; /* in hdr */
	__u16 len;	      /* header bytes in hdr: l4_off + TCP header length */
	__u16 next;	      /* TCP payload bytes (+1 for a FIN): next seq = seq + next */
	__u8 hdr[MPS_PRIO_TMPL_HDR];
};

/* skb->mark values of add_subflow's own clones (TC only): a copy to be turned into the
 * carrier, then the carrier itself; the low byte is the address id. The datapath restores
 * mark 0 on the carrier before it reaches the stack. */
#define MPS_MARK_MASK	 0xffffff00u
#define MPS_MARK_COPY	 0x6d707300u /* "mps\0" */
#define MPS_MARK_CARRIER 0x6d707400u

/* ---- control requests ---------------------------------------------------------------------
 * Agent-to-datapath flow updates. The agent never writes a whole flow entry (that would undo
 * counters the datapath adds meanwhile); it runs the `ctl_flow_update` program (bpf/ctl.bpf.c)
 * with BPF_PROG_TEST_RUN on this request, which writes just the named fields. */
enum mps_ctl_set {
	MPS_CTL_TOKENS = 1 << 0,  /* token[i] where non-zero */
	MPS_CTL_IDSN = 1 << 1,	  /* idsn[i] where non-zero */
	MPS_CTL_CONN = 1 << 2,	  /* conn_token */
	MPS_CTL_RATE = 1 << 3,	  /* rate_bps (0 clears the override) */
	MPS_CTL_SUBFLOW = 1 << 4, /* one more subflow on conns[conn_token] (a join the datapath
				   * saw before the connection entry existed) */
};
struct mps_ctl_flow_req {
	struct mps_flow_key key;
	__u32 set; /* MPS_CTL_* */
	__u32 conn_token;
	__u32 token[2];
	__u64 idsn[2];
	__u64 rate_bps;
};

#endif
