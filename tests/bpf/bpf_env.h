// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Harness for the datapath packet tests: a private pin root and state maps per test, a
// generation built from a ChainSet, BPF_PROG_TEST_RUN through an entry program, counters,
// flow-map reads, and step constructors with typed parameters.
#pragma once

#include <linux/bpf.h>
#include <linux/pkt_cls.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapath/datapath.h"
#include "packet.h"

namespace mpsteer::test {

namespace dp = mpsteer::datapath;
using dp::Hook;
using dp::PortDir;

// Verdicts as BPF_PROG_TEST_RUN reports them.
constexpr uint32_t XDP_PASS_ = XDP_PASS, XDP_DROP_ = XDP_DROP;
constexpr uint32_t TC_PASS_ = uint32_t(TC_ACT_UNSPEC), TC_DROP_ = uint32_t(TC_ACT_SHOT);
enum class Verdict { pass, drop };
uint32_t retval_of(Verdict v, Hook h);
bool is_xdp(Hook h);
const char* name_of(Hook h);

// The hooks every case runs through: XDP (ingress) and TC egress; TC ingress shares the TC
// programs and is exercised by a few cases of its own.
inline const std::vector<Hook> kCaseHooks = {Hook::xdp, Hook::tc_egress};

// ---- steps ----------------------------------------------------------------------------------

constexpr uint16_t END = MPS_PC_END;

mps_step step(mps_prog prog, uint16_t on_match = END, uint16_t on_miss = END);
mps_step sel_src(std::string_view cidr, uint16_t on_match = END, uint16_t on_miss = END);
mps_step sel_dst(std::string_view cidr, uint16_t on_match = END, uint16_t on_miss = END);
// subflow: "addr", port, "addr", port; ip_pair: ports ignored.
mps_step sel_subflow(std::string_view a, uint16_t pa, std::string_view b, uint16_t pb,
                     uint16_t on_match = END, uint16_t on_miss = END);
mps_step sel_ip_pair(std::string_view a, std::string_view b, uint16_t on_match = END,
                     uint16_t on_miss = END);
mps_step sel_port(PortDir dir, uint16_t lo, uint16_t hi, uint16_t on_match = END,
                  uint16_t on_miss = END);
mps_step sel_kinds(uint32_t any_of, uint16_t on_match = END, uint16_t on_miss = END);
mps_step sel_token(uint32_t token, uint16_t on_match = END, uint16_t on_miss = END);
mps_step sel_seq(mps_seq_kind kind, uint64_t lo, uint64_t hi, uint16_t on_match = END,
                 uint16_t on_miss = END);
mps_step sel_bytes(mps_bytes_scope scope, uint64_t lo, uint64_t hi, uint16_t on_match = END,
                   uint16_t on_miss = END);
mps_step act_rate(uint64_t bytes_per_sec, uint32_t rtt_us, uint32_t min_window,
                  uint16_t next = END);

// Steps on every hook starting at pc 0, one policy.
dp::ChainSet chain_of(std::vector<mps_step> steps);
// "selector -> (match) act_drop / (miss) end": the selector's verdict shows as drop / pass.
dp::ChainSet probe(mps_step selector);

// ---- flows ----------------------------------------------------------------------------------

// The normalised flow key of a frame's 4-tuple (lower (address, port) first), computed here
// independently of the BPF code; from_a says whether the frame travels from a to b.
mps_flow_key flow_key_of(const Packet& p, bool* from_a = nullptr);

// ---- environment ----------------------------------------------------------------------------

// A pin root /sys/fs/bpf/mpsteer-test-<pid>-<n>, removed with everything under it.
class PinRoot {
public:
    PinRoot();
    ~PinRoot();
    PinRoot(const PinRoot&) = delete;
    PinRoot& operator=(const PinRoot&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// Pins the calling thread to one CPU while it lives, so per-CPU counters are read whole
// (the loader sums over CPUs anyway) and the kernel's runs happen on one CPU.
class CpuPin {
public:
    CpuPin();
    ~CpuPin();

private:
    bool restored_ = false;
    std::vector<uint8_t> old_;
};

struct Run {
    uint32_t retval = 0;
    Bytes out;
};

// BPF_PROG_TEST_RUN of one frame; the output is the frame only (XDP metadata stripped).
Run raw_run(int prog_fd, const Bytes& frame, bool xdp, uint32_t repeat = 1);

// One case's datapath: by default a load of its own (the programs its chains need) on state
// maps of its own. With MPS_BPF_ONE_LOAD=1 every Env of the process with the same table sizes
// shares one load of every program, emptied between cases (Datapath::reset): what makes
// the label feasible where a load takes minutes (a kernel under software emulation,
// tests/vm/run.sh).
struct Loaded;

class Env {
public:
    explicit Env(const dp::ChainSet& chains, const dp::TableSizes& sizes = {});
    ~Env();
    Run run(Hook h, const Bytes& frame, uint32_t repeat = 1);
    Run run(Hook h, const Packet& p) { return run(h, p.build()); }
    // Rewrites one step of the loaded generation in place (as a parameter update from the
    // agent would): lets a table of cases share one generation instead of loading per case.
    // A step with its own program also gets its prog-array slot (slot = enum mps_prog).
    void set_step(uint32_t pc, const mps_step& s);
    std::vector<dp::StepCounters> steps() const { return gen_->step_counters(); }
    dp::GenCounters gen() const { return gen_->gen_counters(); }
    std::optional<mps_flow> flow(const mps_flow_key& k) const;
    std::optional<mps_flow> flow(const Packet& p) const { return flow(flow_key_of(p)); }
    void put_flow(const mps_flow_key& k, const mps_flow& f);
    std::optional<mps_conn> conn(uint32_t token) const;
    // Events written so far (drained from the ring buffer, tokens derived by EventReader).
    std::vector<dp::Event> events();
    const dp::Generation& generation() const { return *gen_; }
    const dp::StateMaps& state() const;

private:
    CpuPin cpu_;
    std::shared_ptr<Loaded> loaded_;
    std::unique_ptr<dp::Generation> gen_;
    std::unique_ptr<dp::EventReader> reader_;
    std::vector<dp::Event> pending_;
};

// Sleeps until the kernel's clock tick (CONFIG_HZ >= 100) has turned, so the datapath's tick
// clock (tick_ns() in bpf/lib/flow.h) reads a later time than before.
void next_clock_tick();

// Counter deltas between two snapshots.
struct Snap {
    std::vector<dp::StepCounters> steps;
    dp::GenCounters gen;
    static Snap of(const Env& e) { return {e.steps(), e.gen()}; }
};
dp::StepCounters step_delta(const Snap& a, const Snap& b, size_t pc);
// Whether the datapath keeps counters for a step: program steps and the verdicts pass / drop;
// the selectors the interpreter runs inline are not counted (bpf/README.md, "Counters").
bool counted(const mps_step& s);
uint64_t gen_delta(const Snap& a, const Snap& b, mps_gen_counter c);

std::string describe_frame(const Bytes& got, const Bytes& want);

// The 8 bytes of a 64-bit value as they sit on the wire, read into a u64 the way the datapath
// stores keys ("as on the wire").
uint64_t wire64(uint64_t v);
// RFC 8684 §3.1, computed here with OpenSSL: token = most significant 32 bits of
// SHA-256(key), IDSN = least significant 64 bits; `key` is the number written big-endian.
uint32_t token_of(uint64_t key);
uint64_t idsn_of(uint64_t key);

}  // namespace mpsteer::test
