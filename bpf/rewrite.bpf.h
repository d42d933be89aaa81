/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Option-rewriting actors (blk_subflow, add_subflow, set_backup, no_subflows, redirect).
 * Included at the end of datapath.bpf.c: uses its maps, context shim, scan() / opt_ptr()
 * and the ACTOR() macro. Each ACTOR(act_<name>, expr) here defines act_<name>_xdp and
 * act_<name>_tc; the loader puts them in the prog-array slot of their enum mps_prog value.
 */
