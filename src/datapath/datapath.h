// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The userspace side of the datapath: loading a generation from a ChainSet, the shared state
// maps, attaching to interfaces, counters, BPF_PROG_TEST_RUN and the event ring buffer.
// Errors are exceptions (datapath::Error) carrying what failed and why; nothing here exits.
// Implemented by concept: state_maps.cpp (Fd, StateMaps), datapath.cpp (Datapath),
// generation.cpp (Generation), entry_emitter.cpp (a chain emitted as BPF instructions),
// hook_link.cpp (HookLink), test_run.cpp (test_run), events.cpp (EventReader).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "datapath/chain.h"
#include "net/fd.h"

struct ring_buffer;
struct mps_dp;  // the generated skeletons (bpf/datapath.bpf.c, bpf/ctl.bpf.c)
struct mps_ctl;

namespace mpsteer::datapath {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Routes libbpf's messages into spdlog (one level quieter than libbpf says) and mounts bpffs
// when it is missing. Call once at start-up; idempotent.
void init_libbpf_logging();
void ensure_bpffs(const std::string& pin_root);

using net::Fd;  // net/fd.h

// The generated skeletons, destroyed with their owner (bpf/datapath.bpf.c, bpf/ctl.bpf.c).
struct SkeletonDeleter {
    void operator()(struct mps_dp* s) const;
    void operator()(struct mps_ctl* s) const;
};
using DpSkeleton = std::unique_ptr<struct mps_dp, SkeletonDeleter>;
using CtlSkeleton = std::unique_ptr<struct mps_ctl, SkeletonDeleter>;

// How many entries the state tables hold, chosen when the agent creates them (`mpsteer run
// --flows N`; bpf/README.md, "Table sizes"). Everything follows from the subflows tracked: a
// connection has at least one subflow, an announcement or a set_backup template belongs to one.
struct TableSizes {
    static constexpr uint32_t kMinFlows = 1024;
    static constexpr uint32_t kDefaultFlows = 262144;  // a busy server: ~100 MiB in all
    static constexpr uint32_t kSmallFlows = 16384;     // a Raspberry Pi or a test
    static constexpr uint32_t kMaxFlows = 2097152;     // 1 M subflows with room to spare
    uint32_t flows = kDefaultFlows;
    uint32_t conns() const { return std::max(flows / 4, kMinFlows); }
    uint32_t announces() const { return std::max(flows / 16, 256u); }
    uint32_t add_requests() const { return 1024; }
    uint32_t prio_sent() const { return conns(); }  // and set_backup's templates
};

// What one state table is: its capacity and the kernel's memory for it (fdinfo memlock);
// when counted, the entries it holds and, for the LRU tables packets fill (flows,
// announcements), how many entries were evicted to make room.
struct TableInfo {
    std::string name;
    uint32_t capacity = 0;
    uint64_t memory_bytes = 0;
    std::optional<uint64_t> entries;
    std::optional<uint64_t> evictions;
};

// Maps shared by every generation (flow and connection state, events), pinned under
// <pin_root>/maps with the layout version in their names so a layout change never reuses a
// map it cannot read. Created on first use with `sizes`, adopted afterwards at whatever size
// they were made (their entries are live flows; `mpsteer reset` and a restart resize them).
class StateMaps {
public:
    static StateMaps open(const std::string& pin_root, const TableSizes& sizes = {});
    int flows() const { return flows_.get(); }
    int conns() const { return conns_.get(); }
    int events() const { return events_.get(); }
    // The option-rewriting actors' memory (bpf/lib/rewrite.h and its actors): stored ADD_ADDR
    // announcements, pending add_subflow requests, set_backup's signalled state.
    int announces() const { return announces_.get(); }
    int add_requests() const { return add_requests_.get(); }
    int prio_sent() const { return prio_sent_.get(); }
    const std::string& pin_root() const { return root_; }
    // The sizes in force (those of adopted maps where they differ from the ones asked for).
    const TableSizes& sizes() const { return sizes_; }
    // Capacity and memory; with `count`, also entries and evictions (a walk of every table:
    // ~20 ms for a full default flow table, so not per packet or per second).
    std::vector<TableInfo> tables(bool count = false) const;
    // Entries the datapath added, per table (enum mps_table_counter).
    int table_inserts() const { return table_inserts_.get(); }
    // Removes a flow the agent made itself (a pre-flight packet's), counted so that it is
    // not taken for an eviction.
    void remove_flow(const mps_flow_key& k) const;
    // Writes the fields `req.set` names into a flow entry, field by field, so counters the
    // datapath adds meanwhile are kept. False when the flow is not in the map.
    bool update_flow(const mps_ctl_flow_req& req) const;

private:
    std::string root_;
    TableSizes sizes_;
    Fd flows_, conns_, events_, announces_, add_requests_, prio_sent_, table_inserts_;
    CtlSkeleton ctl_;  // bpf/ctl.bpf.c
};

struct StepCounters {
    uint64_t runs = 0, matched = 0, drops = 0, missed_tail_calls = 0;
};
struct GenCounters {
    uint64_t values[MPS_GC_MAX] = {};
};

// The loaded datapath: every program verified once, the prog arrays filled, and two table
// slots. A generation is the contents of one slot; switching generations flips one word
// (bpf/README.md, "Generations"), so it costs microseconds, not a reload.
class Datapath {
public:
    // Loads the BPF object with the shared state maps. `only`: load just these programs plus
    // the entries and interpreters (tests and the bench: verification is most of a load; the
    // preflight entries only when named); empty: every program (the agent). Both slots start empty
    // (every hook: no chain).
    static std::shared_ptr<Datapath> load(const StateMaps& state,
                                          const std::vector<std::string>& only = {});
    // Every program of the BPF object this kernel's verifier refuses, with its verdict (a load
    // without those that failed, again, until the rest loads); *programs: how many there are.
    static std::vector<std::pair<std::string, std::string>> refused_programs(
        const StateMaps& state, size_t* programs = nullptr);
    // What an earlier process loaded and pinned under dir (pin()). Throws Error when the pins
    // are incomplete or from another build of the BPF object.
    static std::shared_ptr<Datapath> adopt(const std::string& dir);
    // Identifies the BPF object this binary carries (SHA-256 prefix of its bytes): pins from
    // a different object are never adopted.
    static std::string object_id();
    ~Datapath();
    Datapath(const Datapath&) = delete;
    Datapath& operator=(const Datapath&) = delete;

    // Pins the programs and the maps only this datapath has under dir (the shared state maps
    // are pinned by StateMaps).
    void pin(const std::string& dir) const;
    int entry_fd(Hook h) const;
    int preflight_fd(Hook h) const;  // the entry on the staged slot (pre-flight test runs)
    int prog_fd(std::string_view name) const;  // e.g. "bench_bare_pass"
    int map_fd(std::string_view name) const;   // e.g. "jmp_xdp", "prio_tmpl", "step_counters"

    // Returns a loaded datapath (not an adopted one) to how load() left it, with the state
    // maps emptied: every hash table (flows, connections, announcements, templates, rate
    // edges, per-interface entries) and per-CPU array (counters, scratch) cleared, the prog
    // arrays filled again, both slots without a chain. The ring buffer is its readers' to
    // drain. For tests that share one load among many cases.
    void reset();

    uint32_t active_slot() const;
    uint32_t live_word() const;  // mps_slots.active: the slot and its compiled entries' epoch
    // Waits, when a flip happened since the last wait (or `always`), until no packet can still
    // be running what was active before (an RCU grace period: membarrier(GLOBAL)).
    void quiesce(bool always = false);

private:
    friend class Generation;
    Datapath() = default;
    mps_table& table(uint32_t slot);
    void set_staged(uint32_t slot);
    void activate(uint32_t live);
    uint32_t next_live(uint32_t slot);  // a live word no compiled entry has had
    void set_testing(uint32_t live);
    void empty_slots();             // every hook of both slots: no chain
    void fill_prog_arrays() const;  // slot N of jmp_*: the program of enum value N (loaded ones)
    uint32_t epoch_ = 0;
    DpSkeleton skel_;                                  // loaded here (none: adopted)
    std::vector<std::pair<std::string, Fd>> adopted_;  // adopted: pins by name
    mps_slots* slots_ = nullptr;  // in .bss: the skeleton's mmap, or ours when adopted
    size_t map_len_ = 0;          // our own mmap's length (adopted)
    bool flipped_ = false;        // a flip since the last quiesce()
};

// BPF_PROG_TEST_RUN on one frame.
struct RunResult {
    uint32_t retval = 0;
    std::vector<uint8_t> out;
    uint32_t duration_ns = 0;  // mean per run, from the kernel
    uint32_t meta_len = 0;     // XDP metadata the program left in front of the frame (not in out)
};
// For TC programs, `ifindex` becomes skb->ifindex (0 leaves the kernel's default).
RunResult test_run(int prog_fd, std::span<const uint8_t> frame, bool xdp, uint32_t repeat = 1,
                   uint32_t ifindex = 0);

// One generation: a chain set written into a slot of a Datapath, and its compiled entries:
// each hook's chain specialised into a small program of its own (emitted by entry_emitter.cpp:
// "compile" is the step from manifests to chains, src/compile; "emit" from chains to BPF), which
// runs while the generation is active and hands other packets to the entry program.
class Generation {
public:
    // Standalone (tests, bench, demo): a Datapath of its own that loads only the programs the
    // chain set needs (plus `also_load`), with the generation active. Throws Error (with the
    // verifier's complaint) and leaves nothing behind.
    // Interface names (per-interface entries, redirect targets) are resolved in the calling
    // thread's network namespace.
    static std::unique_ptr<Generation> build(const ChainSet& chains, uint32_t number,
                                             const StateMaps& state,
                                             const std::vector<std::string>& also_load = {});
    // The same on a datapath loaded before (every program the chain set needs in it).
    static std::unique_ptr<Generation> build(std::shared_ptr<Datapath> dp, const ChainSet& chains,
                                             uint32_t number);
    // Writes the chain set into the slot no packet runs (waiting out packets that ran it
    // before) and makes it the staged slot: preflight_fd() runs it, packets do not until
    // activate(). Overwrites whatever generation had that slot. Compiled entries come with
    // emit_entries() (build() does both).
    static std::unique_ptr<Generation> stage(std::shared_ptr<Datapath> dp, const ChainSet& chains,
                                             uint32_t number);
    // The generation an earlier process activated in `slot` of an adopted datapath.
    static std::unique_ptr<Generation> adopt(std::shared_ptr<Datapath> dp, uint32_t slot,
                                             const ChainSet& chains, uint32_t number);
    Generation(const Generation&) = delete;
    Generation& operator=(const Generation&) = delete;
    ~Generation();

    // Every packet that enters from now on runs this generation (one store).
    void activate();
    // Emits and loads the compiled entries (milliseconds each: the agent does it after the
    // switch, the entry programs run the generation meanwhile). A chain whose entry the kernel
    // refuses keeps running in the entry program; refused() says which and why.
    void emit_entries();
    struct Uncompiled {
        Hook hook;
        uint16_t first;   // the chain's first pc
        std::string why;  // errno and the verifier's verdict, one line
    };
    // Why the chain that starts at `ifname` on hook h runs without its compiled entry because
    // the kernel refused it; "" when it was not refused.
    std::string refusal(Hook h, const std::string& ifname = {}) const;
    bool active() const { return dp_->active_slot() == slot_; }

    uint32_t number() const { return number_; }
    uint32_t slot() const { return slot_; }
    const ChainSet& chains() const { return chains_; }
    const std::shared_ptr<Datapath>& datapath() const { return dp_; }
    // What to attach to `ifname` on hook h: the compiled entry of the chain that starts there,
    // or the datapath's entry program when the chain was not compiled (more than
    // kCompiledMaxSteps steps, or an adopted generation).
    int entry_fd(Hook h, const std::string& ifname = {}) const;
    bool compiled(Hook h, const std::string& ifname = {}) const;
    int preflight_fd(Hook h) const { return dp_->preflight_fd(h); }
    // Runs a frame through everything packets of this generation will enter, before
    // activate(): each hook's preflight entry and every compiled entry (in test mode).
    std::vector<std::pair<Hook, RunResult>> preflight(std::span<const uint8_t> frame) const;
    int prog_fd(std::string_view name) const { return dp_->prog_fd(name); }
    int map_fd(std::string_view name) const { return dp_->map_fd(name); }
    // Redirect targets that did not exist when the generation was staged (those steps pass).
    const std::vector<std::string>& missing_interfaces() const { return missing_; }
    // Changes one step's parameters in place (running packets see the old or the new step).
    // A change compiled entries depend on (an inline step, or a step's program or targets)
    // builds them again under a new live word: entries attached before then hand every packet
    // to the entry program until they are replaced (the agent's writes never need that).
    void write_step(uint32_t pc, const mps_step& step);

    std::vector<StepCounters> step_counters() const;  // summed over CPUs, index = pc
    GenCounters gen_counters() const;

private:
    struct Compiled;  // one loaded compiled entry
    Generation() = default;
    uint16_t first_pc(Hook h, const std::string& ifname) const;
    std::shared_ptr<Datapath> dp_;
    std::vector<std::unique_ptr<Compiled>> compiled_;
    std::vector<Uncompiled> refused_;
    uint32_t live_ = 0;
    uint32_t slot_ = 0;
    uint32_t number_ = 0;
    ChainSet chains_;
    std::vector<std::string> missing_;
};

// The ids of the programs the kernel runs on an interface's hook, whoever attached them: XDP
// in any mode, TCX links (a clsact filter is not listed). In the caller's network namespace.
std::vector<uint32_t> attached_programs(const std::string& ifname, Hook hook);

// Detaches every link pinned in `dir` (one file per link) and returns the names of the files:
// what `mpsteer reset` does with the links an agent left.
std::vector<std::string> detach_pinned_links(const std::string& dir);

// An attachment of a generation's entry program to one interface and hook. XDP through a
// bpf_link (native, generic as fallback), TC through a TCX link where the kernel has it and a
// clsact filter otherwise. Destroying the object detaches unless release() was called.
class HookLink {
public:
    static std::unique_ptr<HookLink> attach(const std::string& ifname, Hook hook, int prog_fd);
    // A link pinned by an earlier process (see pin()); the kernel says which program it runs.
    static std::unique_ptr<HookLink> adopt(const std::string& pin_path, const std::string& ifname,
                                           Hook hook);
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
    // Whether the program behind prog_fd is the one attached. By program id, not descriptor:
    // whoever loaded the attached program may have closed its descriptor since (a generation
    // re-emitting its entries), and the number may belong to another program by now.
    bool runs(int prog_fd) const;
    // A new descriptor of the program attached now (to put it back after a failed switch).
    Fd program() const;
    std::string mode() const { return mode_; }  // "xdp-native", "xdp-generic", "tcx", "tc-filter"
private:
    HookLink() = default;
    std::string ifname_;
    Hook hook_ = Hook::xdp;
    std::string mode_;
    std::string pin_path_;
    int ifindex_ = 0;
    Fd link_;               // bpf_link (XDP, TCX); empty for a clsact filter
    uint32_t prog_id_ = 0;  // the program attached now
    bool released_ = false;
};

// Events from the ring buffer. MP_CAPABLE keys are turned into tokens here (SHA-256) and
// written back to the flow and connection maps, so the `token` selector finds the connection.
// The event carries the flow entry the reader looked up, with what it wrote applied, so the
// handler need not look it up again (the counters are those of that lookup).
struct Event {
    mps_event raw;
    uint32_t token_a = 0, token_b = 0;  // derived tokens for MP_CAPABLE (0: key unknown)
    bool have_flow = false;             // the flows map had raw.flow
    mps_flow flow{};                    // its entry (zero unless have_flow)
};
// What an event's fields mean for its type (abi.h, "what the rest holds per type"), decoded
// here once for every reader: the hooks, the event log, the demo.
struct EventFields {
    std::string_view type;  // "mp_capable", "mp_join", "flow_closed", "add_addr_blocked", "unknown"
    bool backup = false;    // mp_join: the B flag
    bool reset = false;     // flow_closed: by a RST
    std::string address;    // add_addr_blocked: the announced address, as text
    uint16_t port = 0;      // add_addr_blocked: the announced port (0: none)
};
EventFields decode(const mps_event& e);

class EventReader {
public:
    using Handler = std::function<void(const Event&)>;
    EventReader(const StateMaps& state, Handler handler);
    ~EventReader();
    int poll(std::chrono::milliseconds timeout);  // events handled, or throws
    // Handles what the ring holds now without a system call (for a polling reader); events
    // handled, or throws.
    int consume();
    int fd() const;  // epoll-able
private:
    static int on_sample(void* self, void* data, size_t size);
    const StateMaps& state_;
    Handler handler_;
    struct ring_buffer* rb_ = nullptr;
};

// MPTCP token and IDSN from a key as on the wire (RFC 8684 §3.1: the most significant 32 bits
// and the least significant 64 bits of one SHA-256 of the key).
struct MptcpKeyIds {
    uint32_t token = 0;
    uint64_t idsn = 0;
};
MptcpKeyIds mptcp_key_ids(uint64_t key_wire);

// Connection entries this process has inserted so far (EventReader is the conns table's only
// writer). Readers use it to know that a table found empty still is: walking an empty hash
// table visits every bucket.
uint64_t conn_inserts();

}  // namespace mpsteer::datapath
