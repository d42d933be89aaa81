// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The shipped example policies, unchanged, under the real agent in the topology they are
// written for: policies/multi-tenant.yaml on a middle host whose uplinks are eth1 and eth2,
// with the agent managing every interface there (no -i), so a redirected packet meets the
// target's own egress chain; policies/disjoint-subflows.yaml on a lab client with fullmesh
// endpoints, whose addresses are the ones the policy names.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>
#include <fstream>
#include <sstream>

#include "actors_topology.h"
#include "agent_harness.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr uint16_t kPort = 5201;

std::string shipped(const std::string& rel) {
    std::ifstream in(std::string(MPS_SOURCE_DIR) + "/" + rel);
    std::ostringstream s;
    s << in.rdbuf();
    if (s.str().empty()) throw Error("cannot read " + rel);
    return s.str();
}

uint64_t selected(const json& status, const std::string& policy) {
    for (const auto& p : status["policies"])
        if (p.value("name", "") == policy) return p.value("selected", uint64_t(0));
    return 0;
}

}  // namespace

TEST_CASE("shipped multi-tenant policy: one tenant's subflows leave by distinct uplinks",
          "[e2e][policies][redirect]") {
    datapath::init_libbpf_logging();
    e2e::MiddleTopology topo("smt" + std::to_string(getpid() % 10000));
    const std::string cli = topo.ns("cli"), mid = topo.ns("mid"), srv = topo.ns("srv");
    // The policy's names and prefixes: the middle host's uplinks become eth1 and eth2 (names
    // are per namespace), the client is tenant a's VM with one address per uplink (10.1.1/24,
    // 10.1.2/24) and opens its first subflow from the first, its second from the second. The
    // middle host routes the service through eth1, so only the policy puts one on eth2.
    for (auto [from, to, via, metric] : {std::tuple{"u1", "eth1", "10.21.0.2", "10"},
                                         std::tuple{"u2", "eth2", "10.22.0.2", "20"}}) {
        must({"ip", "-n", mid, "link", "set", topo.dev(from), "down"});
        must({"ip", "-n", mid, "link", "set", topo.dev(from), "name", to});
        must({"ip", "-n", mid, "link", "set", to, "up"});
        must({"ip", "-n", mid, "route", "add", "10.29.0.2/32", "via", via, "dev", to, "metric",
              metric});
    }
    for (const char* a : {"10.1.1.1/24", "10.1.2.1/24"})
        must({"ip", "-n", cli, "addr", "add", a, "dev", topo.dev("cm")});
    must({"ip", "-n", cli, "route", "replace", "default", "via", "10.20.0.2", "src", "10.1.1.1"});
    must({"ip", "-n", cli, "mptcp", "endpoint", "flush"});
    must({"ip", "-n", cli, "mptcp", "endpoint", "add", "10.1.2.1", "dev", topo.dev("cm"),
          "subflow"});
    must({"ip", "-n", mid, "route", "add", "10.1.0.0/16", "via", "10.20.0.1", "dev",
          topo.dev("mc")});
    must({"ip", "-n", srv, "route", "add", "10.1.0.0/16", "via", "10.21.0.1"});

    AgentHarness agent(mid, {}, "multitenant");  // every interface of the middle host
    agent.publish({{"multi-tenant.yaml", shipped("policies/multi-tenant.yaml")}});
    agent.start();
    REQUIRE(agent.wait_status([](const json& s) { return s.value("ready", false); }, 120s));
    const json before = agent.status();
    INFO("status: " << before.dump());
    CHECK(before["warnings"].empty());         // eth1 and eth2 exist and are managed
    CHECK(before["attachments"].size() == 3);  // mc, eth1, eth2 at tc_egress

    auto e1a = link_counters(mid, "eth1"), e2a = link_counters(mid, "eth2");
    Sink sink(srv, kPort);
    TrafficStats sent =
        send_stream(cli, e2e::MiddleTopology::kService, kPort, SendOptions::of_time(3s));
    TrafficStats got = sink.wait(30s);
    auto e1b = link_counters(mid, "eth1"), e2b = link_counters(mid, "eth2");
    const uint64_t via1 = e1b.tx_bytes - e1a.tx_bytes, via2 = e2b.tx_bytes - e2a.tx_bytes;
    std::printf(
        "multi-tenant: %llu bytes out of eth1 (tenant a's first subflow), %llu out of "
        "eth2 (its second), sent %llu\n",
        (unsigned long long)via1, (unsigned long long)via2, (unsigned long long)sent.bytes);
    INFO("agent log:\n" << agent.log_tail());
    CHECK(got.bytes == sent.bytes);
    CHECK(got.checksum == sent.checksum);
    CHECK_FALSE(sent.fallback);
    CHECK(sent.subflows == 1);  // the join: both subflows carried the connection
    // The kernel's scheduler decides the split (the first subflow carries most); the second
    // subflow must carry a real share through eth2 (a loop there leaves it near nothing).
    CHECK(via1 > 1000000);
    CHECK(via2 > 200000);
    CHECK(via1 + via2 >= sent.bytes);
    REQUIRE(agent.wait_status(
        [](const json& s) {
            return selected(s, "tenant-a-uplink-1") > 0 && selected(s, "tenant-a-uplink-2") > 0;
        },
        10s));
    // Tenant b's policies leave tenant a's packets alone.
    const json after = agent.status();
    CHECK(selected(after, "tenant-b-uplink-1") == 0);
    CHECK(selected(after, "tenant-b-uplink-2") == 0);
    CHECK(agent.alive());
}

namespace {

// The client's established subflows of the connection to the server's port, as "a->b" by
// address ("10.0.1.1->10.0.2.2"), from the kernel's sockets.
std::multiset<std::string> subflow_pairs(const Lab& lab, uint16_t port) {
    std::multiset<std::string> out;
    const std::string suffix = ":" + std::to_string(port);
    for (const auto& sf : tcp_subflows(lab.client_ns())) {
        if (sf.remote.size() <= suffix.size() ||
            sf.remote.compare(sf.remote.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        // ss writes a bound device after the address ("10.0.2.1%mps-x-c2:40217").
        const std::string local = sf.local.substr(0, sf.local.find_first_of("%:"));
        out.insert(local + "->" + sf.remote.substr(0, sf.remote.size() - suffix.size()));
    }
    return out;
}

// One download from the server's path-1 address while the client's subflows are counted.
std::multiset<std::string> download_subflows(const Lab& lab, uint16_t port, TrafficStats& rx,
                                             TrafficStats& tx) {
    Source source(lab.server_ns(), port, SendOptions::of_time(2s));
    std::multiset<std::string> pairs;
    std::thread watch([&] {
        std::this_thread::sleep_for(1500ms);
        pairs = subflow_pairs(lab, port);
    });
    rx = receive_stream(lab.client_ns(), Lab::server_addr(1), port, 30s);
    watch.join();
    tx = source.wait(10s);
    return pairs;
}

}  // namespace

TEST_CASE("shipped disjoint-subflows policy: one subflow per client link under a full mesh",
          "[e2e][policies][reject]") {
    datapath::init_libbpf_logging();
    // The policy's addresses are the lab's: the client's links 10.0.1.1 (WiFi) and 10.0.2.1
    // (LTE), the server's 10.0.1.2 and its announced 10.0.2.2.
    LabConfig cfg;
    cfg.tag = "dj" + std::to_string(getpid() % 10000);
    cfg.ipv6 = false;
    Lab lab(cfg);
    const std::string cli = lab.client_ns();
    for (const auto& ns : {cli, lab.server_ns()})
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "4", "add_addr_accepted", "2"});
    must({"ip", "-n", cli, "mptcp", "endpoint", "add", Lab::client_addr(1), "dev", lab.client_if(1),
          "fullmesh"});
    must({"ip", "-n", cli, "mptcp", "endpoint", "add", Lab::client_addr(2), "dev", lab.client_if(2),
          "subflow", "fullmesh"});
    const std::multiset<std::string> disjoint{"10.0.1.1->10.0.1.2", "10.0.2.1->10.0.2.2"};

    // The kernel alone: a subflow from each client address to each server address.
    TrafficStats rx, tx;
    auto pairs = download_subflows(lab, 5301, rx, tx);
    CHECK(rx.bytes == tx.bytes);
    CHECK(rx.subflows == 3);
    CHECK(pairs == std::multiset<std::string>{"10.0.1.1->10.0.1.2", "10.0.1.1->10.0.2.2",
                                              "10.0.2.1->10.0.1.2", "10.0.2.1->10.0.2.2"});

    AgentHarness agent(lab, "disjoint", 10, /*client_side=*/true);
    agent.publish({{"disjoint-subflows.yaml", shipped("policies/disjoint-subflows.yaml")}});
    agent.start();
    REQUIRE(agent.wait_status([](const json& s) { return s.value("ready", false); }, 120s));
    INFO("agent log:\n" << agent.log_tail());
    pairs = download_subflows(lab, 5302, rx, tx);
    INFO("client sockets:\n" << lab.ss(cli));
    CHECK(rx.bytes == tx.bytes);
    CHECK(rx.checksum == tx.checksum);
    CHECK_FALSE(rx.fallback);
    CHECK(pairs == disjoint);
    // The refused joins failed at once: no subflow of theirs still connecting (a dropped SYN
    // would stay, counted, and be sent again after a second), and the policy saw each once.
    CHECK(rx.subflows == 1);
    REQUIRE(agent.wait_status([](const json& s) { return selected(s, "disjoint-subflows") >= 2; },
                              10s));
    CHECK(selected(agent.status(), "disjoint-subflows") == 2);
    const auto counters = mptcp_counters(lab.server_ns());
    INFO("server MPTCP MIB: MPJoinSynRx " << counters.at("MPJoinSynRx"));
    CHECK(counters.at("MPJoinSynRx") == 3 + 1);  // 3 joins without the policy, 1 with it
    CHECK(agent.alive());
}
