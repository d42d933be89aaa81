// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The kernel side of the agent. A Rollout alone owns the datapath (loaded once per process, or
// adopted from pins), its generations (the running one, and the previous one, the rollback
// target, in the other slot until the next apply) and the hook links. apply() is the whole
// transaction: validate and compile a revision, build a generation, pre-flight it, switch every
// hook at once, attach and detach links, and on any failure flip back and undo; it reports an
// Outcome and leaves what to make of it (status, retries, the hooks) to the loop.
//
// One writer: every member that changes a generation or a link must be called on the thread
// that made the Rollout (std::logic_error otherwise). Hooks on the event thread change steps
// only through write_steps(), by way of the agent's StepWriteQueue.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "agent/balancer_host.h"
#include "agent/status.h"
#include "datapath/datapath.h"
#include "lua/step_writes.h"
#include "manifest/manifest.h"

namespace mpsteer::agent {

// The interfaces of this network namespace (/sys/class/net shows the mount namespace's, which
// differ under --netns).
std::set<std::string> present_interfaces();

class Rollout {
public:
    Rollout(const Config& cfg, const datapath::StateMaps& state);
    ~Rollout();
    Rollout(const Rollout&) = delete;
    Rollout& operator=(const Rollout&) = delete;

    // What an earlier process left running (its record, its pins, its links). The links are
    // always taken over (they hold the hooks); the generation only when this very BPF object
    // built it. Returns the revision it runs, when a generation was adopted.
    struct Adopted {
        std::string revision, content;
    };
    std::optional<Adopted> adopt();

    // Whether the interfaces (or the links they call for) differ from what the running
    // generation was built for. False while nothing runs.
    bool interfaces_changed(const std::set<std::string>& present) const;

    struct Outcome {
        Stall failure = Stall::none;                // none: the revision runs now
        std::string message;                        // why not (the Stalled condition's message)
        std::vector<std::string> errors, warnings;  // the revision's diagnostics, paths relative
        manifest::Model model;                      // applied: what runs (the Lua hooks follow it)
        uint32_t generation = 0;                    // applied: its number
        double duration_ms = 0;
        bool applied() const { return failure == Stall::none; }
    };
    Outcome apply(const Revision& rev);

    // Loads the running generation's compiled entries and moves the links onto them
    // (bpf/README.md); any failure leaves the entry programs.
    void compile_entries();

    // Hooks' in-place writes (set_policy_backup); writes for another generation are dropped.
    void write_steps(const std::vector<lua::StepWrite>& writes);

    bool running() const { return current_ != nullptr; }
    uint32_t generation() const { return current_ ? current_->number() : 0; }
    std::optional<lua::RunningGeneration> running_generation() const;
    DatapathStatus report() const;
    // After adopting a generation without an apply: the balancer of the revision it runs
    // (the balancer does not outlive the agent). Throws like apply's build step.
    void start_balancer(const std::optional<manifest::Balancer>& spec);

    // On exit: keep the links pinned (the datapath keeps running) or detach them.
    void release_links(bool detach);

    // Detaches every pinned link and removes every pin under pin_root (mpsteer reset).
    static void remove_pins(const std::string& pin_root);

private:
    std::string dp_dir(const std::string& id) const;
    std::string dp_dir() const;
    std::string link_dir() const { return cfg_.pin_root + "/links"; }
    std::string gen_state_path() const { return cfg_.state_dir + "/state/generation.json"; }
    void owner_only(const char* what) const;

    struct LinkKey {
        std::string ifname;
        datapath::Hook hook;
        auto operator<=>(const LinkKey&) const = default;
        std::string pin_name() const;
    };
    // The links a chain set calls for; a policy on every interface leaves out the XDP hook of
    // the balancer's (`balancer_interfaces`, sorted).
    std::set<LinkKey> desired_links(const datapath::ChainSet& c,
                                    const std::set<std::string>& present,
                                    const std::vector<std::string>& balancer_interfaces) const;
    void preflight(const datapath::Generation& g);
    std::map<std::string, PolicyCounters> policy_counters(const datapath::Generation& g) const;
    void retire(std::unique_ptr<datapath::Generation>& g);
    void remove_stale_datapaths();

    Config cfg_;
    const datapath::StateMaps& state_;
    // The state tables as last counted: a count walks every table, so report() recounts at
    // most every kTableCountPeriod.
    static constexpr std::chrono::seconds kTableCountPeriod{10};
    mutable std::vector<datapath::TableInfo> tables_;
    mutable std::chrono::steady_clock::time_point tables_counted_{};
    const std::thread::id owner_ = std::this_thread::get_id();
    std::shared_ptr<datapath::Datapath> dp_;  // loaded (or adopted) once per process
    std::unique_ptr<datapath::Generation> current_, previous_;
    std::map<LinkKey, std::unique_ptr<datapath::HookLink>> links_;
    BalancerHost balancer_;  // the revision's load balancer, changed with its policies
    std::set<std::string> built_with_ifaces_;  // interfaces present when current_ was built
    uint32_t next_gen_ = 1;
    // Counters of generations gone from their slot, so totals never go backwards.
    std::map<std::string, PolicyCounters> retired_;
    datapath::GenCounters retired_gen_;
};

}  // namespace mpsteer::agent
