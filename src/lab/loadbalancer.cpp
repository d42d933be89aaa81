// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The load-balanced service test bed (lab.h, LoadBalancerLab): a client with two paths, a
// router spreading a VIP over its backends by an L4 hash, the backends.
#include <spdlog/spdlog.h>

#include "lab/lab.h"

namespace mpsteer::lab {

namespace {
std::string n(int i) {
    return std::to_string(i);
}
}  // namespace

std::string LoadBalancerLab::vip(int family) {
    return family == 6 ? "2001:db8:113::10" : "203.0.113.10";
}
std::string LoadBalancerLab::unique_addr(int backend, int family) {
    return (family == 6 ? "2001:db8:100::2" : "198.51.100.2") + n(backend - 1);
}
std::string LoadBalancerLab::client_addr(int path, int family) {
    return family == 6 ? "fd00:0:" + n(path) + "::1" : "10.0." + n(path) + ".1";
}

LoadBalancerLab::LoadBalancerLab(const std::string& tag, int backends, bool unique_addresses)
    : prefix_(Lab::kPrefix + tag), backends_(backends), unique_(unique_addresses) {
    if ((prefix_ + "-c1").size() > 15)
        throw Error("load-balancer lab: tag too long for interface names: " + tag);
    if (backends < 1 || backends > kMaxBackends)
        throw Error("load-balancer lab: " + n(backends) + " backends (1 to " + n(kMaxBackends) +
                    ")");
    Lab::require_tools();
    Lab::cleanup_stale();
    Lab::cleanup(prefix_ + "-");
    Lab::claim(prefix_);
    try {
        build();
    } catch (...) {
        Lab::cleanup(prefix_ + "-");
        Lab::release(prefix_);
        throw;
    }
}

LoadBalancerLab::~LoadBalancerLab() {
    try {
        Lab::cleanup(prefix_ + "-");
    } catch (const std::exception& e) {
        spdlog::error("lab: cleanup of {} failed: {}", prefix_, e.what());
    }
    Lab::release(prefix_);
}

void LoadBalancerLab::build() {
    const std::string cli = client_ns(), lb = router_ns();
    std::vector<std::string> all{cli, lb};
    for (int b = 1; b <= backends_; b++) all.push_back(backend_ns(b));
    for (const auto& ns : all) {
        must({"ip", "netns", "add", ns});
        must({"ip", "-n", ns, "link", "set", "lo", "up"});
        // Replies from the VIP leave a backend by another way than the client's path-2
        // packets came in; strict reverse-path filtering would drop them.
        must_in(ns, {"sysctl", "-q", "-w", "net.mptcp.enabled=1", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.default.rp_filter=0", "net.ipv6.conf.all.accept_dad=0",
                     "net.ipv6.conf.default.accept_dad=0"});
    }
    // Policy 1 hashes the 5-tuple: each subflow (its own source port) lands on a backend of
    // its own, which is what breaks MP_JOIN to the VIP.
    must_in(lb, {"sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
                 "net.ipv4.fib_multipath_hash_policy=1", "net.ipv6.fib_multipath_hash_policy=1"});

    for (int p = 1; p <= 2; p++)
        veth_pair(
            {cli, prefix_ + "-c" + n(p), "10.0." + n(p) + ".1/24", "fd00:0:" + n(p) + "::1/64"},
            {lb, prefix_ + "-r" + n(p), "10.0." + n(p) + ".2/24", "fd00:0:" + n(p) + "::2/64"});
    for (int b = 1; b <= backends_; b++)
        veth_pair(
            {lb, prefix_ + "-l" + n(b), "10.1." + n(b) + ".1/24", "fd00:1:" + n(b) + "::1/64"},
            {backend_ns(b), prefix_ + "-v" + n(b), "10.1." + n(b) + ".2/24",
             "fd00:1:" + n(b) + "::2/64"});

    // The client: path 1 by default, its path-2 address out of path 2.
    const std::string c2 = prefix_ + "-c2";
    must({"ip", "-n", cli, "route", "add", "default", "via", "10.0.1.2"});
    must({"ip", "-n", cli, "-6", "route", "add", "default", "via", "fd00:0:1::2"});
    for (const char* v : {"-4", "-6"}) {
        const bool six = v[1] == '6';
        must(
            {"ip", "-n", cli, v, "rule", "add", "from", client_addr(2, six ? 6 : 4), "table", "2"});
        must({"ip", "-n", cli, v, "route", "add", "default", "via",
              six ? "fd00:0:2::2" : "10.0.2.2", "dev", c2, "table", "2"});
    }
    must({"ip", "-n", cli, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted", "2"});
    for (int family : {4, 6})
        must({"ip", "-n", cli, "mptcp", "endpoint", "add", client_addr(2, family), "dev", c2,
              "subflow"});

    // The router: the VIP by hash over every backend, each unique address to its backend.
    for (int family : {4, 6}) {
        const std::string v = family == 6 ? "-6" : "-4", host = family == 6 ? "/128" : "/32";
        std::vector<std::string> ecmp{"ip", "-n", lb, v, "route", "add", vip(family) + host};
        for (int b = 1; b <= backends_; b++) {
            const std::string via = family == 6 ? "fd00:1:" + n(b) + "::2" : "10.1." + n(b) + ".2";
            ecmp.insert(ecmp.end(), {"nexthop", "via", via, "dev", prefix_ + "-l" + n(b)});
            if (unique_)
                must(
                    {"ip", "-n", lb, v, "route", "add", unique_addr(b, family) + host, "via", via});
        }
        must(ecmp);
    }

    // The backends: both addresses on lo, replies through the router, the unique address
    // announced to every client.
    for (int b = 1; b <= backends_; b++) {
        const std::string ns = backend_ns(b);
        must({"ip", "-n", ns, "route", "add", "default", "via", "10.1." + n(b) + ".1"});
        must({"ip", "-n", ns, "-6", "route", "add", "default", "via", "fd00:1:" + n(b) + "::1"});
        for (int family : {4, 6}) {
            const std::string host = family == 6 ? "/128" : "/32";
            must({"ip", "-n", ns, "addr", "add", vip(family) + host, "dev", "lo"});
            if (!unique_) continue;
            must({"ip", "-n", ns, "addr", "add", unique_addr(b, family) + host, "dev", "lo"});
            must({"ip", "-n", ns, "mptcp", "endpoint", "add", unique_addr(b, family), "signal"});
        }
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted", "0"});
    }
    spdlog::debug("load-balancer lab {}: up", prefix_);
}

}  // namespace mpsteer::lab
