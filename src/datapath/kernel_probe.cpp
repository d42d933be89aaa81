// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "datapath/kernel_probe.h"

#include <arpa/inet.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "datapath/datapath.h"
#include "datapath/internal.h"

namespace mpsteer::datapath {
namespace {

std::string read_line(const char* path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

// Why this process cannot load a BPF program, or "" when it can.
std::string bpf_unusable() {
    const bpf_insn pass[] = {
        {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 2 /* XDP_PASS */},
        {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
    };
    if (Fd(bpf_prog_load(BPF_PROG_TYPE_XDP, "mps_probe", "GPL", pass, 2, nullptr))) return {};
    switch (errno) {
    case ENOSYS: return "the kernel has no BPF system call (CONFIG_BPF_SYSCALL)";
    case EPERM: return "not permitted: run as root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON)";
    default: return std::string("a minimal XDP program does not load: ") + std::strerror(errno);
    }
}

// A chain of the shape compiled entries take: selectors (the option walk among them) and pass.
ChainSet sample_chain() {
    ChainSet c;
    c.steps = {cidr4_step(MPS_W_DST, "10.0.0.0", 8, 1),
               port_match(PortDir::dst, 5201, 5201).step(2), kinds_match(MPS_K_DSS).step(3),
               make_step(MPS_ACT_PASS, MPS_PC_END)};
    c.entries.push_back({Hook::xdp, "", 0});
    c.policies.push_back("probe");
    return c;
}

}  // namespace

bool kernel_has_btf() {
    static const bool btf = std::filesystem::exists("/sys/kernel/btf/vmlinux");
    return btf;
}

std::string why_datapath_without_btf() {
    static const std::string why = []() -> std::string {
        if (std::getenv("MPSTEER_DATAPATH_WITHOUT_BTF"))
            return "MPSTEER_DATAPATH_WITHOUT_BTF is set";
        if (!kernel_has_btf()) return "the kernel has no BTF (/sys/kernel/btf/vmlinux)";
        if (read_line("/proc/sys/net/core/bpf_jit_enable") == "0")
            return "the JIT is off (net.core.bpf_jit_enable=0), and the interpreter takes no "
                   "program that makes both subprogram calls and tail calls";
        utsname u{};
        const std::string machine = uname(&u) == 0 ? u.machine : "";
        // 32-bit ARM and x86: their JITs compile no subprogram calls (the interpreter then
        // refuses the program as above).
        if (machine.starts_with("arm") ||
            (machine.size() == 4 && machine[0] == 'i' && machine.ends_with("86")))
            return "a 32-bit kernel (" + machine + "), whose JIT compiles no subprogram calls";
        return {};
    }();
    return why;
}

KernelReport probe_kernel_basics() {
    KernelReport r;
    utsname u{};
    if (uname(&u) == 0) {
        r.release = u.release;
        r.machine = u.machine;
    }
    r.bpf_unusable = bpf_unusable();
    const std::string jit = read_line("/proc/sys/net/core/bpf_jit_enable");
    r.jit = !jit.empty() && jit != "0";
    r.mptcp = read_line("/proc/sys/net/mptcp/enabled") == "1";
    int major = 0, minor = 0;
    std::sscanf(r.release.c_str(), "%d.%d", &major, &minor);
    r.tcx = major > 6 || (major == 6 && minor >= 6);
    r.btf = kernel_has_btf();
    r.without_btf = why_datapath_without_btf();
    return r;
}

KernelReport probe_kernel() {
    KernelReport r = probe_kernel_basics();
    if (!r.bpf_unusable.empty()) return r;
    ensure_bpffs("/sys/fs/bpf");
    const std::string root = "/sys/fs/bpf/mpsteer-probe-" + std::to_string(getpid());
    struct Cleanup {
        std::string root;
        ~Cleanup() {
            std::error_code ec;
            std::filesystem::remove_all(root, ec);
        }
    } cleanup{root};
    TableSizes sizes;
    sizes.flows = TableSizes::kMinFlows;
    auto state = StateMaps::open(root, sizes);
    try {
        for (auto& [program, why] : Datapath::refused_programs(state, &r.programs))
            r.programs_refused.push_back({program, why});
    } catch (const std::exception& e) {
        r.load_failed = e.what();
        return r;
    }
    if (r.programs_refused.empty()) {
        auto g = Generation::build(sample_chain(), 1, state);
        if (!g->compiled(Hook::xdp)) {
            r.compiled_entry_refused = g->refusal(Hook::xdp);
            if (r.compiled_entry_refused.empty()) r.compiled_entry_refused = "not emitted";
        }
    }
    return r;
}

}  // namespace mpsteer::datapath
