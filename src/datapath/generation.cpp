// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Generations (Generation): a chain set written into a table slot of a Datapath (staged,
// pre-flighted, activated, adopted, written in place) and its compiled entries, the programs
// entry_emitter.cpp emits for each hook's chain; the generation's counters.
#include "datapath/entry_emitter.h"
#include "datapath/internal.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

namespace mpsteer::datapath {

using detail::fail;
using detail::read_percpu;

namespace {
void check_or_throw(const ChainSet& chains) {
    if (auto problems = chains.check(); !problems.empty()) {
        std::string msg = "invalid chain set:";
        for (const auto& p : problems) msg += "\n  " + p;
        throw Error(msg);
    }
}

// The programs (XDP and TC variants) a step runs in; none for the inline ones.
std::vector<std::string> programs_of(const mps_step& st) {
    auto p = static_cast<mps_prog>(st.prog);
    if (!has_program(p)) return {};
    return {detail::program_name(p, true), detail::program_name(p, false)};
}
}  // namespace

std::unique_ptr<Generation> Generation::build(const ChainSet& chains, uint32_t number,
                                              const StateMaps& state,
                                              const std::vector<std::string>& also_load) {
    check_or_throw(chains);  // before the load: an invalid chain set costs no verification
    std::vector<std::string> only = also_load;
    for (const auto& st : chains.steps)
        for (auto& name : programs_of(st)) only.push_back(std::move(name));
    only.push_back(detail::kAlwaysLoaded[0]);  // never empty: empty means every program
    return build(Datapath::load(state, only), chains, number);
}

std::unique_ptr<Generation> Generation::build(std::shared_ptr<Datapath> dp, const ChainSet& chains,
                                              uint32_t number) {
    auto g = stage(std::move(dp), chains, number);
    if (!g->missing_interfaces().empty())
        throw Error("interface " + g->missing_interfaces().front() + " not found");
    g->emit_entries();
    g->activate();
    return g;
}

std::unique_ptr<Generation> Generation::stage(std::shared_ptr<Datapath> dp, const ChainSet& chains,
                                              uint32_t number) {
    check_or_throw(chains);
    // Every step's program must be loaded (a missing one is an error here, not a missed tail
    // call later).
    for (const auto& st : chains.steps)
        for (const auto& name : programs_of(st)) dp->prog_fd(name);
    // Resolve interface names now. A redirect target that does not exist (yet) leaves the
    // step inert (ifindex 0: the packet goes on) and is reported; the agent stages again when
    // the interface appears.
    std::vector<mps_step> steps = chains.steps;
    std::vector<std::string> missing;
    for (const auto& [pc, ifname] : chains.step_ifnames) {
        if (pc >= steps.size()) throw Error("interface parameter for a missing step");
        unsigned idx = if_nametoindex(ifname.c_str());
        if (!idx) missing.push_back(ifname);
        steps[pc].p.redirect.ifindex = idx;
    }
    mark_guarded(steps);
    std::vector<std::pair<mps_iface_key, __u16>> ifents;
    mps_entry entry[MPS_HOOK_MAX];
    for (uint32_t h = 0; h < MPS_HOOK_MAX; ++h) entry[h] = {MPS_PC_END, 0, number};
    for (Hook h : chains.learning_hooks) entry[static_cast<uint32_t>(h)].flags |= MPS_ENTRYF_LEARN;
    const uint32_t slot = dp->active_slot() ^ 1;
    for (const auto& e : chains.entries) {
        auto h = static_cast<uint32_t>(e.hook);
        if (e.ifname.empty()) {
            entry[h].pc = e.pc;
        } else {
            entry[h].flags |= MPS_ENTRYF_PER_IFACE;
            ifents.push_back(
                {{detail::ifindex_of(e.ifname), static_cast<__u16>(h), static_cast<__u16>(slot)},
                 static_cast<__u16>(e.pc)});
        }
    }

    // From here on the slot is ours: wait out packets that may still run it.
    dp->quiesce();
    const int ifent_fd = dp->map_fd("iface_entries");
    std::vector<mps_iface_key> stale;
    mps_iface_key k{}, next{};
    for (int r = bpf_map_get_next_key(ifent_fd, nullptr, &next); r == 0;
         r = bpf_map_get_next_key(ifent_fd, &k, &next)) {
        if (next.slot == slot) stale.push_back(next);
        k = next;
    }
    for (const auto& key : stale) bpf_map_delete_elem(ifent_fd, &key);
    for (const auto& [key, pc] : ifents)
        if (bpf_map_update_elem(ifent_fd, &key, &pc, BPF_ANY))
            fail("writing a per-interface entry", errno);
    detail::zero_percpu(dp->map_fd("step_counters"), slot * MPS_MAX_STEPS, MPS_MAX_STEPS,
                        sizeof(mps_step_counters));
    detail::zero_percpu(dp->map_fd("gen_counters"), slot * MPS_GC_MAX, MPS_GC_MAX, sizeof(__u64));
    auto& t = dp->table(slot);
    std::memset(t.steps, 0, sizeof t.steps);
    std::copy(steps.begin(), steps.end(), t.steps);
    std::copy(std::begin(entry), std::end(entry), t.entries);
    dp->set_staged(slot);

    std::unique_ptr<Generation> g(new Generation());
    g->live_ = dp->next_live(slot);
    g->dp_ = std::move(dp);
    g->slot_ = slot;
    g->number_ = number;
    g->chains_ = chains;
    g->missing_ = std::move(missing);
    return g;
}

std::unique_ptr<Generation> Generation::adopt(std::shared_ptr<Datapath> dp, uint32_t slot,
                                              const ChainSet& chains, uint32_t number) {
    std::unique_ptr<Generation> g(new Generation());
    // Running already: keep its word, so the entries the links hold stay live. Otherwise (the
    // flip back after a kill) a new one: entries compiled for the other run must not run.
    const uint32_t live = dp->live_word();
    g->live_ = (live & 1) == (slot & 1) ? live : dp->next_live(slot);
    g->dp_ = std::move(dp);
    g->slot_ = slot & 1;
    g->number_ = number;
    g->chains_ = chains;
    return g;
}

Generation::~Generation() = default;

void Generation::activate() {
    dp_->activate(live_);
}

void Generation::write_step(uint32_t pc, const mps_step& step) {
    if (pc >= chains_.steps.size()) throw Error("no step " + std::to_string(pc));
    for (const auto& name : programs_of(step)) dp_->prog_fd(name);
    // Compiled entries hold inline steps whole, and of program steps what runs next.
    const mps_step& old = chains_.steps[pc];
    const bool emit_again =
        !compiled_.empty() && (old.prog != step.prog || old.on_match != step.on_match ||
                               old.on_miss != step.on_miss || old.flags != step.flags ||
                               (!has_program(static_cast<mps_prog>(step.prog)) &&
                                std::memcmp(&old.p, &step.p, sizeof step.p)));
    if (emit_again) {
        const bool was_active = dp_->live_word() == live_;
        live_ = dp_->next_live(slot_);
        if (was_active) dp_->activate(live_);  // the old entries hand everything on from now
    }
    auto& table = dp_->table(slot_);
    auto& dst = table.steps[pc];
    chains_.steps[pc] = step;
    std::vector<mps_step> marked = chains_.steps;
    mark_guarded(marked);
    // Parameters first, the program byte last: a packet sees the old step or the new one
    // for the fields that decide what runs.
    std::memcpy(&dst.p, &step.p, sizeof step.p);
    dst.on_match = step.on_match;
    dst.on_miss = step.on_miss;
    dst.policy = step.policy;
    dst.flags = marked[pc].flags;
    __atomic_store_n(&dst.prog, step.prog, __ATOMIC_RELEASE);
    // New targets may put a guard behind other steps, or take one away.
    for (size_t i = 0; i < marked.size(); ++i)
        __atomic_store_n(&table.steps[i].flags, marked[i].flags, __ATOMIC_RELAXED);
    if (emit_again) emit_entries();
}

// ---- compiled entries (emitted by entry_emitter.cpp) ---------------------------------------

struct Generation::Compiled {
    Hook hook;
    uint16_t first;  // the chain's first pc in the table
    Fd prog;
    int fd() const { return prog.get(); }
};

namespace {
// The loaded entry, or why the kernel refused it (errno and the verifier's verdict; the whole
// log at debug level).
Fd load_compiled(Hook hook, const std::vector<bpf_insn>& insns, std::string& why) {
    const bool xdp = hook == Hook::xdp;
    const auto type = xdp ? BPF_PROG_TYPE_XDP : BPF_PROG_TYPE_SCHED_CLS;
    const char* name = xdp ? "fast_xdp" : "fast_tc";
    // The attach type libbpf gives SEC("xdp") / SEC("tc"): the prog arrays take only
    // programs like their owner, the datapath's entry.
    LIBBPF_OPTS(bpf_prog_load_opts, opts,
                .expected_attach_type = xdp ? BPF_XDP : bpf_attach_type(0));
    int fd = bpf_prog_load(type, name, "Dual BSD/GPL", insns.data(), insns.size(), &opts);
    if (fd >= 0) return Fd(fd);
    const int err = errno;
    std::string log(1 << 22, '\0');  // again, with the verifier's log
    opts.log_buf = log.data();
    opts.log_size = static_cast<__u32>(log.size());
    opts.log_level = 1;
    Fd again(bpf_prog_load(type, name, "Dual BSD/GPL", insns.data(), insns.size(), &opts));
    if (again) return again;                 // refused once only: take it
    const bool truncated = errno == ENOSPC;  // before 6.4 a full log keeps its start only
    log.resize(std::strlen(log.c_str()));
    spdlog::debug("the verifier's log for the compiled {} entry:\n{}", to_string(hook), log);
    why = std::strerror(err);
    if (truncated)
        why += " (the verifier's log outgrew its buffer)";
    else if (auto v = detail::verifier_verdict(log); !v.empty())
        why += " (the verifier: " + v + ")";
    return Fd();
}
}  // namespace

uint16_t Generation::first_pc(Hook h, const std::string& ifname) const {
    uint16_t pc = MPS_PC_END;
    for (const auto& e : chains_.entries) {
        if (e.hook != h) continue;
        if (!ifname.empty() && e.ifname == ifname) return e.pc;
        if (e.ifname.empty()) pc = e.pc;
    }
    return pc;
}

void Generation::emit_entries() {
    std::vector<std::unique_ptr<Compiled>> out;
    std::vector<Uncompiled> refused;
    std::set<std::pair<Hook, uint16_t>> chains;
    for (const auto& e : chains_.entries)
        if (e.pc != MPS_PC_END) chains.insert({e.hook, e.pc});
    for (auto [hook, first] : chains) {
        const EntryMaps maps{
            dp_->map_fd("bss"), dp_->map_fd(hook == Hook::xdp ? "jmp_xdp" : "jmp_tc"),
            dp_->map_fd("step_counters"), dp_->map_fd("gen_counters"), dp_->map_fd("xdp_pkt_ctx")};
        auto insns = emit_entry(chains_.steps, first, hook, live_, maps);
        if (!insns) {
            spdlog::debug("{} chain at pc {}: no compiled entry (the entry program runs it)",
                          to_string(hook), first);
            continue;
        }
        std::string why;
        Fd prog = load_compiled(hook, *insns, why);
        if (!prog) {
            refused.push_back({hook, first, std::move(why)});
            continue;
        }
        auto c = std::make_unique<Compiled>();
        c->hook = hook;
        c->first = first;
        c->prog = std::move(prog);
        out.push_back(std::move(c));
    }
    compiled_ = std::move(out);
    refused_ = std::move(refused);
}

int Generation::entry_fd(Hook h, const std::string& ifname) const {
    const uint16_t first = first_pc(h, ifname);
    for (const auto& c : compiled_)
        if (c->hook == h && c->first == first) return c->fd();
    return dp_->entry_fd(h);
}

std::string Generation::refusal(Hook h, const std::string& ifname) const {
    const uint16_t first = first_pc(h, ifname);
    for (const auto& r : refused_)
        if (r.hook == h && r.first == first) return r.why;
    return {};
}

bool Generation::compiled(Hook h, const std::string& ifname) const {
    return entry_fd(h, ifname) != dp_->entry_fd(h);
}

std::vector<std::pair<Hook, RunResult>> Generation::preflight(
    std::span<const uint8_t> frame) const {
    std::vector<std::pair<Hook, RunResult>> out;
    for (Hook h : kHooks)
        out.emplace_back(h, test_run(dp_->preflight_fd(h), frame, h == Hook::xdp));
    struct Testing {  // compiled entries run their chain while testing holds their word
        Datapath& dp;
        ~Testing() { dp.set_testing(0); }
    } testing{*dp_};
    dp_->set_testing(live_);
    for (const auto& c : compiled_)
        out.emplace_back(c->hook, test_run(c->fd(), frame, c->hook == Hook::xdp));
    return out;
}

std::vector<StepCounters> Generation::step_counters() const {
    std::vector<StepCounters> out(chains_.steps.size());
    const int fd = dp_->map_fd("step_counters");
    for (uint32_t pc = 0; pc < out.size(); ++pc)
        for (const auto& c : read_percpu<mps_step_counters>(fd, slot_ * MPS_MAX_STEPS + pc)) {
            out[pc].runs += c.runs;
            out[pc].matched += c.matched;
            out[pc].drops += c.drops;
            out[pc].missed_tail_calls += c.missed_tail_calls;
        }
    return out;
}

GenCounters Generation::gen_counters() const {
    GenCounters out;
    const int fd = dp_->map_fd("gen_counters");
    for (uint32_t i = 0; i < MPS_GC_MAX; ++i)
        for (auto v : read_percpu<uint64_t>(fd, slot_ * MPS_GC_MAX + i)) out.values[i] += v;
    return out;
}

}  // namespace mpsteer::datapath
