// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The balancer a revision asks for (kind: Balancer) on this host: lb::Balancer loaded while one
// is asked for, XDP on the clients' interfaces, the backends' interfaces and this host's MACs
// on them looked up, and a thread that learns the tokens. The Rollout changes it together with
// the policies, as one revision: prepare() finds everything the host must have before the
// switch, commit() cannot half-apply. Its maps and links are pinned (PIN_ROOT/lb) and the
// backends' indices recorded (STATE/state/balancer.json): it keeps forwarding while the agent
// is away, and the next agent takes it over with its subflows and tokens.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lb/balancer.h"
#include "manifest/manifest.h"

namespace mpsteer::datapath {
class HookLink;
}

namespace mpsteer::agent {

class BalancerHost {
public:
    // What commit() needs, resolved on this host.
    struct Plan {
        std::optional<manifest::Balancer> spec;  // nullopt: no balancer
        std::vector<lb::Service> services;
        std::vector<lb::Target> targets;
    };

    BalancerHost(std::string pin_dir, std::string state_file);
    ~BalancerHost();  // leaves the pinned balancer running
    BalancerHost(const BalancerHost&) = delete;
    BalancerHost& operator=(const BalancerHost&) = delete;

    // Looks up the interfaces and this host's MACs on the backends' ones. Throws
    // std::runtime_error naming the document, the backend and the interface that is missing.
    Plan prepare(const std::optional<manifest::Balancer>& spec) const;

    // Makes `plan` run: loads the balancer (again when its table sizes change), writes services
    // and backends, attaches to new interfaces and leaves the ones no longer named. Throws
    // after putting everything back when an attach fails.
    void commit(Plan plan);

    // On exit with --detach-on-exit: the balancer's links and pins go too.
    void detach();
    // Detaches the pinned links under `pin_dir` and removes it (mpsteer reset).
    static void remove_pins(const std::string& pin_dir);

    bool running() const { return lb_ != nullptr; }
    const std::optional<manifest::Balancer>& spec() const { return spec_; }
    // The interfaces whose XDP hook the balancer holds (the policies' entries stay off them).
    const std::vector<std::string>& interfaces() const;
    // {name, interfaces: [{interface, mode}], services, backends, tokens_learnt, counters};
    // null when no balancer runs.
    nlohmann::json status() const;

private:
    void start_learner();
    void stop_learner();
    // A balancer for `spec`'s table sizes: the one an earlier agent left pinned when its sizes
    // and record match (its links adopted), else a new one (stale pins removed first).
    std::unique_ptr<lb::Balancer> load(const manifest::Balancer& spec);
    void record() const;  // the table sizes and the backends' indices, for the next agent
    std::string link_pin(const std::string& ifname) const { return pin_dir_ + "/links/" + ifname; }

    std::string pin_dir_, state_file_;
    std::optional<manifest::Balancer> spec_;
    std::unique_ptr<lb::Balancer> lb_;
    std::map<std::string, std::unique_ptr<datapath::HookLink>> links_;  // by interface
    mutable std::mutex mu_;  // lb_'s writers and readers against the learner's restarts
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> learnt_{0};
    std::string learn_error_;  // the learner's last failure (it keeps trying)
    std::thread learner_;
};

}  // namespace mpsteer::agent
