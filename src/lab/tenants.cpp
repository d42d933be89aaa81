// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The multi-tenant test bed (lab.h, TenantLab): tenant VMs, a hypervisor with two shaped
// uplinks spreading the service by an L4 hash, a server behind both.
#include <spdlog/spdlog.h>

#include "lab/lab.h"

namespace mpsteer::lab {

TenantLab::TenantLab(const std::string& tag, unsigned uplink_kbit) : prefix_(Lab::kPrefix + tag) {
    if ((prefix_ + "-s1").size() > 15)
        throw Error("tenant lab: tag too long for interface names: " + tag);
    Lab::require_tools();
    Lab::cleanup_stale();
    Lab::cleanup(prefix_ + "-");
    Lab::claim(prefix_);
    try {
        build(uplink_kbit);
    } catch (...) {
        Lab::cleanup(prefix_ + "-");
        Lab::release(prefix_);
        throw;
    }
}

TenantLab::~TenantLab() {
    try {
        Lab::cleanup(prefix_ + "-");
    } catch (const std::exception& e) {
        spdlog::error("lab: cleanup of {} failed: {}", prefix_, e.what());
    }
    Lab::release(prefix_);
}

void TenantLab::build(unsigned uplink_kbit) {
    const std::string vm = vm_ns(), hv = hypervisor_ns(), srv = server_ns();
    for (const auto& ns : {vm, hv, srv}) {
        must({"ip", "netns", "add", ns});
        must({"ip", "-n", ns, "link", "set", "lo", "up"});
        // Replies come back by uplink 1 whichever uplink the data left by.
        must_in(ns, {"sysctl", "-q", "-w", "net.mptcp.enabled=1", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.default.rp_filter=0"});
    }
    // Policy 1 hashes the 5-tuple: each subflow (its own source address and port) gets an
    // uplink of its own choosing, as an operator spreading tenants over both uplinks would.
    must_in(hv, {"sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
                 "net.ipv4.fib_multipath_hash_policy=1"});

    veth_pair({vm, prefix_ + "-t", std::string(kTenantAddr[0]) + "/24", ""},
              {hv, prefix_ + "-h", "10.1.1.254/24", ""});
    for (const char* a : {kTenantAddr[1], kBackgroundAddr})
        must({"ip", "-n", vm, "addr", "add", std::string(a) + "/24", "dev", prefix_ + "-t"});
    for (const char* a : {"10.1.2.254/24", "10.2.1.254/24"})
        must({"ip", "-n", hv, "addr", "add", a, "dev", prefix_ + "-h"});
    for (int n = 1; n <= 2; n++) {
        const std::string net = "10.31." + std::to_string(n);
        veth_pair({hv, uplink(n), net + ".1/24", ""},
                  {srv, prefix_ + "-s" + std::to_string(n), net + ".2/24", ""});
        shape_egress(hv, uplink(n), uplink_kbit);
    }

    // The VMs: tenant a's second address opens the second subflow; tenant b's address is the
    // source towards the background service.
    must({"ip", "-n", vm, "route", "add", "default", "via", "10.1.1.254"});
    must({"ip", "-n", vm, "route", "add", std::string(kBackgroundService) + "/32", "via",
          "10.1.1.254", "src", kBackgroundAddr});
    must({"ip", "-n", vm, "mptcp", "limits", "set", "subflow", "1", "add_addr_accepted", "0"});
    must({"ip", "-n", vm, "mptcp", "endpoint", "add", kTenantAddr[1], "dev", prefix_ + "-t",
          "subflow"});

    must({"ip", "-n", hv, "route", "add", std::string(kService) + "/32", "nexthop", "via",
          "10.31.1.2", "dev", uplink(1), "nexthop", "via", "10.31.2.2", "dev", uplink(2)});
    must({"ip", "-n", hv, "route", "add", std::string(kBackgroundService) + "/32", "via",
          "10.31.1.2", "dev", uplink(1)});

    for (const char* a : {kService, kBackgroundService})
        must({"ip", "-n", srv, "addr", "add", std::string(a) + "/32", "dev", "lo"});
    for (const char* p : {"10.1.0.0/16", "10.2.0.0/16"})
        must({"ip", "-n", srv, "route", "add", p, "via", "10.31.1.1"});
    must({"ip", "-n", srv, "mptcp", "limits", "set", "subflow", "1", "add_addr_accepted", "0"});
    spdlog::debug("tenant lab {}: up", prefix_);
}

}  // namespace mpsteer::lab
