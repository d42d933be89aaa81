// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The compiler: a validated manifest model -> the datapath's ChainSet (steps with encoded
// parameters, entry points per hook and interface, attachments), plus the plan model that
// `mpsteer plan` diffs and the agent stores as the running generation's description.
// Pure and deterministic: the same model gives byte-identical ChainSet::serialize() output.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datapath/chain.h"
#include "manifest/manifest.h"

namespace mpsteer::compile {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Output {
    datapath::ChainSet chains;
    std::vector<std::string> step_text;  // per pc: the manifest's wording of the step
};

// Layout (documented in schemas/README.md):
// - For each hook (xdp, tc_egress, tc_ingress): when every policy on it applies to all
//   interfaces, one entry point with an empty ifname; otherwise one entry per named interface
//   (the policies naming it plus those naming none) and, if some policies name no interface,
//   a default entry with an empty ifname for the other interfaces. Each entry has its own copy
//   of its steps, so counters are per interface.
// - In an entry, policies run by (priority, name). A policy's selectors branch: a miss jumps
//   to the next policy's first step (or ends), a full match goes to its first action; actions
//   run in order and then end the chain, or go on to the next policy with `continue: true`.
//   pass and drop end the chain themselves.
// - ChainSet::policies holds the policy names sorted; mps_step.policy indexes it.
// - Attachments: each (interface, hook) named by a policy, plus (\"\", hook) meaning "every
//   interface the agent manages" for policies that name none.
// Throws Error when the result does not fit the datapath (more than MPS_MAX_STEPS steps).
Output compile(const manifest::Model& model);

// The datapath limits that depend on the layout above, as diagnostics at the policy a
// manifest author must edit: the step table (MPS_MAX_STEPS, counting every per-interface
// copy) and step programs on one path (datapath::kMaxActorsPerPath, from this policy on).
// Steps on one path (MPS_MAX_CHAIN) are checked by the manifest stage itself.
std::vector<manifest::Diagnostic> check_limits(const manifest::Model& model);

// ---- plan ----------------------------------------------------------------------------------

struct PlanPolicy {
    std::string name;
    std::string canonical;  // manifest::Policy::canonical
    std::vector<std::string> hooks;
    uint32_t priority = 0;
    bool operator==(const PlanPolicy&) const = default;
};

// What a generation runs: kept by the agent in applied.json, compared by `mpsteer plan`.
struct PlanModel {
    std::string revision;
    std::vector<PlanPolicy> policies;  // sorted by name
    // The balancer (kind: Balancer) as canonical JSON text, "" when the revision has none:
    // two revisions run the same balancer when this text is the same.
    std::string balancer;
    datapath::ChainSet chains;
    std::vector<std::string> step_text;
};

inline constexpr const char* kAppliedStatePath = "/run/mpsteer/state/applied.json";

PlanModel make_plan_model(const manifest::Model& model, const Output& out,
                          std::string revision = "");
// JSON form of applied.json (format version 1):
// {"format": 1, "revision": "...", "policies": [{"name", "priority", "hooks", "canonical"}],
//  "balancer": {canonical} (absent: none),
//  "steps": [{"pc", "prog", "on_match", "on_miss", "policy", "flags", "text", "raw"}],
//  "entries": [{"hook", "ifname", "pc"}], "attachments": [{"hook", "ifname"}],
//  "step_ifnames": [{"pc", "ifname"}], "policy_table": ["name", ...]}
// "raw" is the hex of the 48-byte mps_step, so from_json restores the ChainSet exactly.
nlohmann::json to_json(const PlanModel& m);
PlanModel plan_model_from_json(const nlohmann::json& j);  // throws Error when malformed
// nullopt when the file does not exist; throws Error when it exists but cannot be read.
std::optional<PlanModel> read_applied(const std::string& path = kAppliedStatePath);

struct HookPlan {
    std::string hook;
    std::string ifname;                  // "" = every interface
    std::string status;                  // "added", "removed", "changed", "unchanged"
    std::vector<std::string> steps;      // the new chain (the old one when removed)
    std::vector<std::string> old_steps;  // when changed
};

struct PlanDiff {
    std::vector<std::string> added, changed, removed, unchanged;  // policy names, sorted
    std::string balancer;  // "added", "changed", "removed", "unchanged"; "": none either side
    std::string balancer_name;
    std::vector<HookPlan> hooks;  // by hook, then interface
    // Attachments of the new set with no chain, there to learn handshakes for a rate_limit.
    std::vector<datapath::Attachment> learning;
    bool empty() const {
        return added.empty() && changed.empty() && removed.empty() &&
               (balancer.empty() || balancer == "unchanged");
    }
};

PlanDiff diff(const PlanModel& running, const PlanModel& next);
std::string to_text(const PlanDiff& d);
nlohmann::json to_json(const PlanDiff& d);

// The chain of one entry point as text lines, pcs relative to the entry so that an unrelated
// change elsewhere does not show up as a change here: "+0 sel_match dst 10.0.1.0/24
// match->+1 miss->+3 [policy]".
std::vector<std::string> entry_lines(const PlanModel& m, const datapath::EntryPoint& e);

}  // namespace mpsteer::compile
