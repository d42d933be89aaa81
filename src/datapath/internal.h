// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What the datapath's own files share and nothing outside them uses: error reporting, program
// and interface names, the shared state maps by name, per-CPU counter access.
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "datapath/datapath.h"

namespace mpsteer::datapath::detail {

// Throws Error("what: strerror(err)"); err may be negative (libbpf) or positive (errno).
// ENOTSUPP (524, kernel-internal, no strerror) is the JIT refusing what the verifier accepted.
[[noreturn]] inline void fail(const std::string& what, int err) {
    const int e = err < 0 ? -err : err;
    if (e == 524)
        throw Error(what +
                    ": this kernel's JIT refused a program its verifier accepted (ENOTSUPP: an "
                    "instruction that JIT does not compile, such as atomic operations on 32-bit "
                    "ARM); with net.core.bpf_jit_enable=0 the interpreter runs it");
    throw Error(what + ": " + std::strerror(e));
}

// "sel_token_xdp", "act_record_tc", ...: a step program's name in the BPF object.
inline std::string program_name(mps_prog p, bool xdp) {
    return std::string(prog_name(p)) + (xdp ? "_xdp" : "_tc");
}

// Whether step program p reads the packet's options (in the build without kernel BTF, the
// walk program runs before it: bpf/datapath.bpf.c, opt_walk_*): MPS_PROGRAMS' `options`.
constexpr bool reads_options(mps_prog p) {
    switch (p) {
#define MPS_PROG_OPTIONS(e, value, name, inl, options) \
    case e: return options;
        MPS_PROGRAMS(MPS_PROG_OPTIONS)
#undef MPS_PROG_OPTIONS
    default: return false;
    }
}

// The hook's entry program ("entry_xdp", ...) or its preflight twin ("preflight_xdp", ...).
const char* entry_name(Hook h, bool preflight);
// Programs every chain needs (the entries and the interpreters): always loaded.
inline constexpr const char* kAlwaysLoaded[] = {"entry_xdp", "entry_tc_egress", "entry_tc_ingress",
                                                "interp_xdp", "interp_tc"};
inline constexpr const char* kPreflightEntries[] = {"preflight_xdp", "preflight_tc_egress",
                                                    "preflight_tc_ingress"};

// The verifier's verdict on a refused program in one line: the log's last line that says
// something (it ends with statistics).
std::string verifier_verdict(std::string_view log);
// The last program libbpf failed to load in this process and the verifier's verdict on it
// (its whole log goes to the debug level); empty when none failed.
struct Refusal {
    std::string program, verdict;
};
Refusal last_refusal();
void forget_refusal();  // before a load, so a failure without a log names no earlier program

// In the calling thread's network namespace; throws Error when there is no such interface.
uint32_t ifindex_of(const std::string& ifname);

// The shared state maps (bpf/lib/state_maps.h): makes every load of a BPF object use the
// pinned ones, and tells them apart from the maps a Datapath owns.
void reuse_state_maps(bpf_object* obj, const StateMaps& state);
bool is_state_map(std::string_view name);

// Per-CPU array values, one per possible CPU (8-byte strides).
int possible_cpus();
template <typename T>
std::vector<T> read_percpu(int fd, uint32_t key) {
    static_assert(sizeof(T) % 8 == 0);
    std::vector<T> vals(possible_cpus());
    if (bpf_map_lookup_elem(fd, &key, vals.data())) fail("reading counters", errno);
    return vals;
}
// Zeroes keys [first, first + n) of a per-CPU array in one syscall.
void zero_percpu(int fd, uint32_t first, uint32_t n, size_t value_size);

}  // namespace mpsteer::datapath::detail
