// The userspace side of the datapath: loading a generation from a ChainSet, the shared state
// maps, attaching to interfaces, counters, BPF_PROG_TEST_RUN and the event ring buffer.
// Errors are exceptions (datapath::Error) carrying what failed and why; nothing here exits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "datapath/chain.h"

struct ring_buffer;
struct mps_dp;   // the generated skeletons (bpf/datapath.bpf.c, bpf/ctl.bpf.c)
struct mps_ctl;

namespace mpsteer::datapath {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Routes libbpf's messages into spdlog (one level quieter than libbpf says) and mounts bpffs
// when it is missing. Call once at start-up; idempotent.
void init_libbpf_logging();
void ensure_bpffs(const std::string& pin_root);

// An owned file descriptor.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    Fd& operator=(Fd&& o) noexcept;
    ~Fd();
    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
private:
    int fd_ = -1;
};

// Maps shared by every generation (flow and connection state, events), pinned under
// <pin_root>/maps with the layout version in their names so a layout change never reuses a
// map it cannot read. Created on first use, adopted afterwards.
class StateMaps {
public:
    static StateMaps open(const std::string& pin_root);  // create or adopt
    int flows() const { return flows_.get(); }
    int conns() const { return conns_.get(); }
    int events() const { return events_.get(); }
    // The option-rewriting actors' memory (bpf/rewrite.bpf.h): stored ADD_ADDR
    // announcements, pending add_subflow requests, set_backup's signalled state.
    int announces() const { return announces_.get(); }
    int add_requests() const { return add_requests_.get(); }
    int prio_sent() const { return prio_sent_.get(); }
    const std::string& pin_root() const { return root_; }
    // Writes the fields `req.set` names into a flow entry, field by field, so counters the
    // datapath adds meanwhile are kept. False when the flow is not in the map.
    bool update_flow(const mps_ctl_flow_req& req) const;
private:
    struct CtlDeleter {
        void operator()(struct mps_ctl* c) const;
    };
    std::string root_;
    Fd flows_, conns_, events_, announces_, add_requests_, prio_sent_;
    std::unique_ptr<struct mps_ctl, CtlDeleter> ctl_;  // bpf/ctl.bpf.c
};

struct StepCounters {
    uint64_t runs = 0, matched = 0, drops = 0, missed_tail_calls = 0;
};
struct GenCounters {
    uint64_t values[MPS_GC_MAX] = {};
};

// One loaded generation: every program verified, prog arrays and step table filled.
class Generation {
public:
    // Loads and fills; throws Error (with the verifier's complaint) and leaves nothing behind.
    // Interface names (per-interface entries, redirect targets) are resolved in the calling
    // thread's network namespace.
    // Only the programs the chain set needs are loaded (entries, interpreters, its step
    // programs) plus `also_load` (e.g. the bench yardsticks): verification is most of the time
    // a build takes, and an unused program cannot fail it.
    static std::unique_ptr<Generation> build(const ChainSet& chains, uint32_t number,
                                             const StateMaps& state,
                                             const std::vector<std::string>& also_load = {});
    // A generation an earlier process built and pinned (pin()): its entry programs and
    // counters, without loading anything. Throws Error when the pins are incomplete.
    static std::unique_ptr<Generation> adopt(const std::string& dir, const ChainSet& chains,
                                             uint32_t number);
    ~Generation();
    Generation(const Generation&) = delete;
    Generation& operator=(const Generation&) = delete;

    uint32_t number() const { return number_; }
    const ChainSet& chains() const { return chains_; }
    int entry_fd(Hook h) const;
    int prog_fd(std::string_view program_name) const;  // e.g. "bench_bare_pass" (built only)
    int map_fd(std::string_view map_name) const;       // e.g. "jmp_xdp", "steps" (built only)

    std::vector<StepCounters> step_counters() const;  // summed over CPUs, index = pc
    GenCounters gen_counters() const;

    // Pins the entry programs and the per-generation maps (the prog arrays among them: a
    // prog array is emptied when its last reference goes, and packets may still be in it).
    void pin(const std::string& dir) const;
private:
    Generation() = default;
    uint32_t number_ = 0;
    ChainSet chains_;
    struct mps_dp* skel_ = nullptr;  // built here; null when adopted
    std::vector<Fd> adopted_;        // adopted: entry_xdp, entry_tc_egress, entry_tc_ingress,
                                     // step_counters, gen_counters
};

// BPF_PROG_TEST_RUN on one frame.
struct RunResult {
    uint32_t retval = 0;
    std::vector<uint8_t> out;
    uint32_t duration_ns = 0;  // mean per run, from the kernel
};
// For TC programs, `ifindex` becomes skb->ifindex (0 leaves the kernel's default).
RunResult test_run(int prog_fd, std::span<const uint8_t> frame, bool xdp, uint32_t repeat = 1,
                   uint32_t ifindex = 0);

// An attachment of a generation's entry program to one interface and hook. XDP through a
// bpf_link (native, generic as fallback), TC through a TCX link where the kernel has it and a
// clsact filter otherwise. Destroying the object detaches unless release() was called.
class HookLink {
public:
    static std::unique_ptr<HookLink> attach(const std::string& ifname, Hook hook, int prog_fd);
    // A link pinned by an earlier process (see pin()); prog_fd is the program it runs now.
    static std::unique_ptr<HookLink> adopt(const std::string& pin_path, const std::string& ifname,
                                           Hook hook, int prog_fd);
    ~HookLink();
    // Atomically swaps the program (the old one keeps running until the swap). With
    // expect_current, fails if someone else swapped it since (BPF_F_REPLACE).
    void update(int new_prog_fd, bool expect_current = true);
    void pin(const std::string& path);
    // Detaches now and removes the pin.
    void detach();
    // Leave it attached when this object goes (the agent exits): only a pinned link survives
    // its last file descriptor.
    void release() { released_ = true; }
    const std::string& ifname() const { return ifname_; }
    Hook hook() const { return hook_; }
    std::string mode() const { return mode_; }  // "xdp-native", "xdp-generic", "tcx", "tc-filter"
private:
    HookLink() = default;
    std::string ifname_;
    Hook hook_ = Hook::xdp;
    std::string mode_;
    std::string pin_path_;
    int ifindex_ = 0;
    Fd link_;           // bpf_link (XDP, TCX); empty for a clsact filter
    int prog_fd_ = -1;  // the program attached now (expected old program on update)
    bool released_ = false;
};

// Events from the ring buffer. MP_CAPABLE keys are turned into tokens here (SHA-256) and
// written back to the flow and connection maps, so the `token` selector finds the connection.
struct Event {
    mps_event raw;
    uint32_t token_a = 0, token_b = 0;  // derived tokens for MP_CAPABLE (0: key unknown)
};
class EventReader {
public:
    using Handler = std::function<void(const Event&)>;
    EventReader(const StateMaps& state, Handler handler);
    ~EventReader();
    int poll(std::chrono::milliseconds timeout);  // events handled, or throws
    int fd() const;                               // epoll-able
private:
    static int on_sample(void* self, void* data, size_t size);
    const StateMaps& state_;
    Handler handler_;
    struct ring_buffer* rb_ = nullptr;
};

// MPTCP token and IDSN from a key as on the wire (RFC 8684 §3.1: SHA-256, most significant 32
// bits / least significant 64 bits).
uint32_t mptcp_token(uint64_t key_wire);
uint64_t mptcp_idsn(uint64_t key_wire);

}  // namespace mpsteer::datapath
