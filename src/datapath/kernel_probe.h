// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What this host's kernel offers the datapath, found by trying it: the BPF system call, the
// JIT, MPTCP, TCX, every program of the BPF object through this kernel's verifier, and a
// compiled entry. `mpsteer validate --host` prints it; `mpsteer run` checks the essentials
// before it loads anything.
#pragma once

#include <string>
#include <vector>

namespace mpsteer::datapath {

struct KernelReport {
    std::string release, machine;  // uname
    // The BPF system call with this process's privileges: "" when a program loads, else why
    // not (no CONFIG_BPF_SYSCALL, no CAP_BPF/CAP_SYS_ADMIN, ...). Nothing else runs without it.
    std::string bpf_unusable;
    bool jit = false;    // net.core.bpf_jit_enable: programs run compiled, not interpreted
    bool mptcp = false;  // net.mptcp.enabled exists and is 1
    bool tcx = false;    // TCX links (6.6+); clsact filters otherwise
    bool btf = false;    // /sys/kernel/btf/vmlinux (kernel_has_btf())
    // Why the datapath built without kernel BTF runs here (why_datapath_without_btf()), or "".
    std::string without_btf;
    std::string load_failed;  // the object did not load for a reason that names no program
    struct Refused {
        std::string program;  // e.g. act_set_backup_xdp
        std::string why;      // the verifier's verdict
    };
    std::vector<Refused> programs_refused;  // of the whole BPF object
    size_t programs = 0;                    // in the object
    std::string compiled_entry_refused;     // "" when a sample chain's compiled entry loads
};

// Whether the kernel describes its own types (/sys/kernel/btf/vmlinux), which CO-RE reads need.
bool kernel_has_btf();
// Which of the two builds of the datapath this kernel runs (bpf/README.md, "Two builds of the
// datapath"): "" for the one with CO-RE reads and subprogram calls, which needs kernel BTF and
// a JIT that compiles subprogram calls; else why the one without kernel BTF runs instead (no
// BTF, the JIT off, a 32-bit kernel, or MPSTEER_DATAPATH_WITHOUT_BTF=1 in the environment).
std::string why_datapath_without_btf();

// The essentials only (uname, the BPF system call, JIT, MPTCP, TCX): cheap.
KernelReport probe_kernel_basics();
// Everything: also loads every program and a compiled entry (seconds; needs bpffs for the
// state maps, pinned under a temporary directory and removed).
KernelReport probe_kernel();

}  // namespace mpsteer::datapath
