// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lab/token_balancer.h"

#include <arpa/inet.h>
#include <net/if.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "datapath/datapath.h"

namespace mpsteer::lab {

namespace {

// An interface's MAC and index inside a namespace.
std::pair<lb::Mac, uint32_t> link_of(const std::string& netns, const std::string& ifname) {
    const auto j = nlohmann::json::parse(must({"ip", "-n", netns, "-j", "link", "show", ifname}));
    if (!j.is_array() || j.empty()) throw Error("lab: no interface " + ifname + " in " + netns);
    lb::Mac mac{};
    const std::string text = j[0].value("address", "");
    unsigned v[6];
    if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) !=
        6)
        throw Error("lab: no MAC address on " + ifname + " in " + netns);
    for (int i = 0; i < 6; ++i) mac[i] = static_cast<uint8_t>(v[i]);
    return {mac, j[0].value("ifindex", 0u)};
}

lb::Service service_of(int family, uint16_t port, mps_lb_unknown_action unknown) {
    lb::Service s;
    s.family = static_cast<uint8_t>(family);
    inet_pton(family == 6 ? AF_INET6 : AF_INET, LoadBalancerLab::vip(family).c_str(),
              s.addr.data());
    s.port = port;
    s.unknown_token = unknown;
    return s;
}

}  // namespace

TokenBalancer::TokenBalancer(const LoadBalancerLab& lab, uint16_t port, int serving,
                             mps_lb_unknown_action unknown)
    : lab_(lab) {
    // A frame from a wire carries a complete checksum; one from a veth whose sender offloads
    // it carries only the pseudo-header's, which the skb's metadata completes and an XDP
    // redirect drops: the client's veths checksum their own frames, as a NIC's peer would.
    for (int p = 1; p <= 2; ++p)
        must_in(lab.client_ns(), {"ethtool", "-K", lab.client_if(p), "tx", "off"});
    balancer_.set_services({service_of(4, port, unknown), service_of(6, port, unknown)});
    set_backends(serving);
    // A veth takes XDP-redirected frames only while its peer runs an XDP program.
    for (int b = 1; b <= lab.backends(); ++b) {
        NetnsGuard in(lab.backend_ns(b));
        peer_links_.push_back(datapath::HookLink::attach(lab.backend_if(b), datapath::Hook::xdp,
                                                         balancer_.veth_peer_prog_fd()));
    }
    {
        NetnsGuard in(lab.router_ns());
        for (int p = 1; p <= 2; ++p) {
            links_.push_back(datapath::HookLink::attach(lab.router_client_if(p),
                                                        datapath::Hook::xdp, balancer_.prog_fd()));
            mode_ = links_.back()->mode();
        }
    }
    learner_ = std::thread([this] {
        while (!stop_) balancer_.learn(std::chrono::milliseconds(50));
    });
}

TokenBalancer::~TokenBalancer() {
    stop_ = true;
    learner_.join();
    links_.clear();  // closing a link detaches it, in whichever namespace
    peer_links_.clear();
}

void TokenBalancer::set_backends(int serving, const std::vector<int>& draining) {
    std::vector<lb::Target> targets;
    for (int b = 1; b <= serving; ++b) {
        lb::Target t;
        t.backend.name = "backend-" + std::to_string(b);
        t.backend.draining = std::find(draining.begin(), draining.end(), b) != draining.end();
        t.mac = link_of(lab_.backend_ns(b), lab_.backend_if(b)).first;
        std::tie(t.src_mac, t.ifindex) = link_of(lab_.router_ns(), lab_.router_backend_if(b));
        targets.push_back(t);
    }
    std::lock_guard lock(mu_);
    balancer_.set_backends(targets);
}

lb::Counters TokenBalancer::counters() const {
    std::lock_guard lock(mu_);
    return balancer_.counters();
}

int TokenBalancer::owner_of(uint32_t token) const {
    std::lock_guard lock(mu_);
    const int index = balancer_.owner_of(token);
    for (int b = 1; b <= lab_.backends(); ++b)
        if (index >= 0 && balancer_.index_of("backend-" + std::to_string(b)) == index) return b;
    return 0;
}

}  // namespace mpsteer::lab
