// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The MPTCP-aware balancer (lb::Balancer, bpf/lb.bpf.c) on a LoadBalancerLab's router: XDP on
// the router's client-facing interfaces, the VIP on port `port` in both families, direct
// server return at L2 to the backends' own interfaces, and a thread that learns tokens from
// the third ACKs as they pass.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lab/lab.h"
#include "lb/balancer.h"

namespace mpsteer::datapath {
class HookLink;
}

namespace mpsteer::lab {

// Sends one MP_JOIN SYN with `token` from src:sport to dst:dport (family 4 or 6) by a raw
// socket inside `netns`: what a host that guesses tokens sends. The TCP checksum is complete.
void send_join_syn(const std::string& netns, int family, const std::string& src, uint16_t sport,
                   const std::string& dst, uint16_t dport, uint32_t token);

class TokenBalancer {
public:
    // Starts with backends 1..serving (of the lab's); unknown tokens get `unknown`.
    TokenBalancer(const LoadBalancerLab& lab, uint16_t port, int serving,
                  mps_lb_unknown_action unknown = MPS_LB_UNKNOWN_DROP);
    ~TokenBalancer();
    TokenBalancer(const TokenBalancer&) = delete;
    TokenBalancer& operator=(const TokenBalancer&) = delete;

    // Backends 1..serving, those in `draining` owning no slots.
    void set_backends(int serving, const std::vector<int>& draining = {});
    lb::Counters counters() const;
    // The lab's backend number a token belongs to (0: none).
    int owner_of(uint32_t token) const;
    std::string mode() const { return mode_; }  // how XDP attached: "xdp-native", ...

private:
    const LoadBalancerLab& lab_;
    mutable std::mutex mu_;  // set_backends against the readers (the learner needs none)
    lb::Balancer balancer_;
    std::vector<std::unique_ptr<datapath::HookLink>> links_, peer_links_;
    std::string mode_;
    std::atomic<bool> stop_{false};
    std::thread learner_;
};

}  // namespace mpsteer::lab
