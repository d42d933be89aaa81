// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The MPTCP-aware balancer (bpf/lb.bpf.c) on a router in front of backends that have no address
// of their own to announce: every join the clients' path managers send to the VIP reaches the
// backend that owns its connection (0 MPJoinNoTokenFound), IPv4 and IPv6; forged joins reach
// no backend. The agent running the balancer a revision declares.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent_harness.h"
#include "lab/lab.h"
#include "datapath/datapath.h"
#include "lab/token_balancer.h"
#include "lb/balancer.h"
#include "net/mptcp_pm.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace std::chrono_literals;

namespace {

constexpr uint16_t kPort = 443;

uint64_t mib(const LoadBalancerLab& lab, int b, const char* name) {
    const auto c = mptcp_counters(lab.backend_ns(b));
    auto it = c.find(name);
    return it == c.end() ? 0 : it->second;
}

uint64_t mib_sum(const LoadBalancerLab& lab, const char* name) {
    uint64_t n = 0;
    for (int b = 1; b <= lab.backends(); ++b) n += mib(lab, b, name);
    return n;
}

}  // namespace

TEST_CASE("lb: joins to the VIP reach the backend that owns their token, v4 and v6", "[e2e][lb]") {
    datapath::init_libbpf_logging();
    LoadBalancerLab lab("lbt" + std::to_string(getpid() % 1000), 3, false);
    TokenBalancer tb(lab, kPort, 3);
    INFO("xdp mode: " << tb.mode());
    for (int family : {4, 6}) {
        INFO("IPv" << family);
        std::vector<std::unique_ptr<Discard>> servers;
        for (int b = 1; b <= lab.backends(); ++b)
            servers.push_back(std::make_unique<Discard>(lab.backend_ns(b), kPort, family == 6));
        const uint64_t syn_rx0 = mib_sum(lab, "MPJoinSynRx");
        const uint64_t no_token0 = mib_sum(lab, "MPJoinNoTokenFound");
        const auto c0 = tb.counters();
        constexpr unsigned kConns = 30;
        {
            ConnectionSet conns(lab.client_ns(), LoadBalancerLab::vip(family), kPort, kConns);
            // Long enough for a join sent again: one that outruns its token (the learner had
            // not taken the key off the ring yet) is dropped, and the client's SYN timer sends
            // it again a second later.
            for (int tick = 0; tick < 30; ++tick) {
                conns.send_each(4096);
                std::this_thread::sleep_for(100ms);
            }
            unsigned joined = 0;
            for (const auto& st : conns.states()) {
                CHECK(st.error == 0);
                CHECK_FALSE(st.fallback);
                joined += st.subflows == 1;
            }
            CHECK(joined == kConns);
        }
        std::this_thread::sleep_for(200ms);
        const auto c = tb.counters();
        CHECK(mib_sum(lab, "MPJoinNoTokenFound") - no_token0 == 0);
        CHECK(mib_sum(lab, "MPJoinSynRx") - syn_rx0 == kConns);
        CHECK(c[MPS_LB_C_JOINS_ROUTED] - c0[MPS_LB_C_JOINS_ROUTED] == kConns);
        INFO("joins that came before their token: " << c[MPS_LB_C_JOINS_UNKNOWN] -
                                                           c0[MPS_LB_C_JOINS_UNKNOWN]);
        CHECK(c[MPS_LB_C_KEYS_SEEN] - c0[MPS_LB_C_KEYS_SEEN] >= kConns);
        unsigned accepted = 0;
        for (int b = 1; b <= lab.backends(); ++b) {
            INFO("backend " << b);
            CHECK(servers[b - 1]->accepted() > 0);  // 30 connections over 3 backends
            accepted += servers[b - 1]->accepted();
        }
        CHECK(accepted == kConns);
    }
}

TEST_CASE("lb: forged joins with random tokens reach no backend", "[e2e][lb]") {
    datapath::init_libbpf_logging();
    LoadBalancerLab lab("lbf" + std::to_string(getpid() % 1000), 2, false);
    TokenBalancer tb(lab, kPort, 2);
    Discard s1(lab.backend_ns(1), kPort, true), s2(lab.backend_ns(2), kPort, true);
    const uint64_t syn_rx0 = mib_sum(lab, "MPJoinSynRx");
    std::mt19937 rng(42);
    for (uint16_t i = 0; i < 50; ++i)
        for (int family : {4, 6})
            send_join_syn(lab.client_ns(), family, LoadBalancerLab::client_addr(1, family),
                          uint16_t(50000 + i), LoadBalancerLab::vip(family), kPort, rng());
    // The first IPv6 ones wait for neighbour discovery.
    for (int i = 0; i < 50 && tb.counters()[MPS_LB_C_JOINS_UNKNOWN] < 100; ++i)
        std::this_thread::sleep_for(100ms);
    CHECK(tb.counters()[MPS_LB_C_JOINS_UNKNOWN] == 100);
    CHECK(mib_sum(lab, "MPJoinSynRx") - syn_rx0 == 0);
    CHECK(s1.accepted() + s2.accepted() == 0);
}

namespace {

std::string mac_in(const std::string& netns, const std::string& ifname) {
    const auto j = nlohmann::json::parse(must({"ip", "-n", netns, "-j", "link", "show", ifname}));
    return j.at(0).at("address").get<std::string>();
}

// A Balancer manifest for the lab's router: both client-facing interfaces, the VIP in both
// families, backends 1..n (draining the ones listed), their interfaces as given.
std::string balancer_manifest(const LoadBalancerLab& lab, int n,
                              const std::vector<int>& draining = {},
                              const std::string& backend_if_override = "") {
    std::string m =
        "apiVersion: mpsteer.dev/v1\nkind: Balancer\nmetadata: {name: web}\nspec:\n"
        "  interfaces: [" +
        lab.router_client_if(1) + ", " + lab.router_client_if(2) +
        "]\n  services:\n    - {vip: " + LoadBalancerLab::vip(4) +
        ", ports: [443]}\n    - {vip: \"" + LoadBalancerLab::vip(6) +
        "\", ports: [443]}\n  backends:\n";
    for (int b = 1; b <= n; ++b) {
        const bool drain = std::find(draining.begin(), draining.end(), b) != draining.end();
        m += "    - {name: backend-" + std::to_string(b) + ", mac: \"" +
             mac_in(lab.backend_ns(b), lab.backend_if(b)) + "\", interface: " +
             (backend_if_override.empty() ? lab.router_backend_if(b) : backend_if_override) +
             (drain ? ", draining: true" : "") + "}\n";
    }
    return m;
}

// A policy on every interface, XDP included: the balancer's interfaces are left out of its XDP.
const char* kEverywhere = R"(apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: count-all}
spec:
  attach: {hooks: [xdp, tc_ingress]}
  priority: 10
  actions:
    - record: {}
)";

// Whether status.json lists the policies' entry on an interface's hook.
bool policy_link(const nlohmann::json& status, const std::string& ifname, const char* hook) {
    for (const auto& a : status["attachments"])
        if (a.value("interface", "") == ifname && a.value("hook", "") == hook) return true;
    return false;
}

bool xdp_on(const std::string& netns, const std::string& ifname) {
    const auto j = nlohmann::json::parse(must({"ip", "-n", netns, "-j", "link", "show", ifname}));
    return j.at(0).contains("xdp");
}

}  // namespace

// The agent runs the balancer a revision declares (kind: Balancer) on the router: joins reach
// their backend, status and metrics show it; a revision naming an interface the router lacks is
// refused whole while the balancer runs on; a drain is a new revision; the balancer outlives a
// restart with its tokens; removing the document leaves the interfaces, and `mpsteer reset`
// takes down what a stopped agent left.
TEST_CASE("lb: the agent runs a Balancer manifest, refuses a broken one whole and removes it",
          "[e2e][lb]") {
    datapath::init_libbpf_logging();
    LoadBalancerLab lab("lba" + std::to_string(getpid() % 1000), 2, false);
    // What TokenBalancer does for a test bed, the agent does not: the client's veths checksum
    // their own frames, and the backends' veths take redirected frames (their peer runs XDP).
    for (int p = 1; p <= 2; ++p)
        must_in(lab.client_ns(), {"ethtool", "-K", lab.client_if(p), "tx", "off"});
    lb::Balancer for_its_pass_program;
    std::vector<std::unique_ptr<datapath::HookLink>> peer_links;
    for (int b = 1; b <= 2; ++b) {
        NetnsGuard in(lab.backend_ns(b));
        peer_links.push_back(datapath::HookLink::attach(lab.backend_if(b), datapath::Hook::xdp,
                                                        for_its_pass_program.veth_peer_prog_fd()));
    }
    agent_e2e::AgentHarness agent(lab.router_ns(), {}, "lba");
    agent.metrics_port = 19000 + getpid() % 1000;
    agent.publish({{"balancer.yaml", balancer_manifest(lab, 2)}, {"policy.yaml", kEverywhere}});
    agent.start();
    auto balancer_with = [](size_t backends) {
        return [backends](const nlohmann::json& s) {
            return s.value("ready", false) && s["balancer"].is_object() &&
                   s["balancer"]["backends"].size() == backends;
        };
    };
    REQUIRE(agent.wait_status(balancer_with(2), 60s, 20ms));
    CHECK(xdp_on(lab.router_ns(), lab.router_client_if(1)));
    CHECK(xdp_on(lab.router_ns(), lab.router_client_if(2)));
    {
        const auto st = agent.status();
        INFO(st["attachments"].dump());
        CHECK_FALSE(policy_link(st, lab.router_client_if(1), "xdp"));
        CHECK(policy_link(st, lab.router_client_if(1), "tc_ingress"));
        CHECK(policy_link(st, lab.router_backend_if(1), "xdp"));
    }

    Discard s1(lab.backend_ns(1), kPort, false), s2(lab.backend_ns(2), kPort, false);
    auto joins_through = [&](unsigned n) {
        const uint64_t no_token0 = mib_sum(lab, "MPJoinNoTokenFound");
        const uint64_t syn_rx0 = mib_sum(lab, "MPJoinSynRx");
        ConnectionSet conns(lab.client_ns(), LoadBalancerLab::vip(4), kPort, n);
        for (int tick = 0; tick < 30; ++tick) {
            conns.send_each(4096);
            std::this_thread::sleep_for(100ms);
        }
        unsigned joined = 0;
        for (const auto& st : conns.states()) joined += st.error == 0 && st.subflows == 1;
        CHECK(joined == n);
        CHECK(mib_sum(lab, "MPJoinNoTokenFound") - no_token0 == 0);
        CHECK(mib_sum(lab, "MPJoinSynRx") - syn_rx0 == n);
    };
    joins_through(20);
    CHECK(s1.accepted() > 0);
    CHECK(s2.accepted() > 0);
    REQUIRE(agent.wait_status(
        [](const nlohmann::json& s) {
            return s["balancer"].is_object() &&
                   s["balancer"]["counters"].value("joins_routed", 0) >= 20 &&
                   s["balancer"].value("tokens_learnt", 0) >= 20;
        },
        5s, 50ms));
    const std::string metrics = must_in(
        lab.router_ns(),
        {"curl", "-s", "http://127.0.0.1:" + std::to_string(agent.metrics_port) + "/metrics"});
    CHECK(metrics.find("mpsteer_lb_packets_total{balancer=\"web\",counter=\"joins_routed\"}") !=
          std::string::npos);
    {  // Prometheus's own linter on the whole page, the balancer's series with the rest.
        const std::string page = "/tmp/mpsteer-lba-metrics-" + std::to_string(getpid());
        std::ofstream(page) << metrics;
        const auto lint = run({"sh", "-c", "promtool check metrics < " + page});
        std::filesystem::remove(page);
        INFO(lint.out);
        CHECK(lint.status == 0);
    }
    const std::string text =
        must({agent_e2e::mpsteer_bin(), "status", "--state-dir", agent.state_dir()});
    CHECK(text.find("balancer:   web on") != std::string::npos);

    // A backend behind an interface the router lacks: refused, the running balancer untouched.
    const nlohmann::json before = agent.status();
    agent.publish({{"balancer.yaml", balancer_manifest(lab, 2, {}, "nosuch0")},
                   {"policy.yaml", kEverywhere}});
    REQUIRE(agent.wait_status([](const nlohmann::json& s) { return !s.value("ready", true); }, 20s,
                              20ms));
    const nlohmann::json refused = agent.status();
    INFO(refused.dump());
    CHECK(refused["errors"].dump().find("interface 'nosuch0' does not exist on this host") !=
          std::string::npos);
    CHECK(refused["errors"].dump().find("balancer.yaml") != std::string::npos);
    CHECK(refused["generation"] == before["generation"]);
    CHECK(refused["balancer"]["backends"] == before["balancer"]["backends"]);
    joins_through(10);

    // Draining backend 2: a new revision, the same balancer (its tokens stay).
    agent.publish(
        {{"balancer.yaml", balancer_manifest(lab, 2, {2})}, {"policy.yaml", kEverywhere}});
    REQUIRE(agent.wait_status(
        [](const nlohmann::json& s) {
            return s.value("ready", false) && s["balancer"].is_object() &&
                   s["balancer"]["backends"][1].value("draining", false);
        },
        20s, 20ms));
    const unsigned at_two = s2.accepted();
    joins_through(10);
    CHECK(s2.accepted() == at_two);

    // The balancer outlives its agent, and the next agent takes it over: connections opened
    // before the restart still have their tokens, so joins they open after it (the client's
    // path-2 endpoint renewed: every connection joins again) reach their backend.
    {
        const uint64_t no_token0 = mib_sum(lab, "MPJoinNoTokenFound");
        const uint64_t syn_rx0 = mib_sum(lab, "MPJoinSynRx");
        constexpr unsigned kOld = 10;
        ConnectionSet conns(lab.client_ns(), LoadBalancerLab::vip(4), kPort, kOld);
        for (int tick = 0; tick < 20; ++tick) {
            conns.send_each(1024);
            std::this_thread::sleep_for(100ms);
        }
        CHECK(agent.stop() == 0);
        CHECK(xdp_on(lab.router_ns(), lab.router_client_if(1)));  // still forwarding
        conns.send_each(1024);
        agent.start();
        REQUIRE(agent.wait_status(
            [](const nlohmann::json& s) {
                return s.value("ready", false) && s["balancer"].is_object() &&
                       s["balancer"]["backends"][1].value("draining", false);
            },
            60s, 20ms));
        {
            NetnsGuard in(lab.client_ns());
            net::MptcpPathManager pm;
            REQUIRE(pm.renew(LoadBalancerLab::client_addr(2, 4)));
        }
        for (int tick = 0; tick < 30; ++tick) {
            conns.send_each(1024);
            std::this_thread::sleep_for(100ms);
        }
        for (const auto& st : conns.states()) {
            CHECK(st.error == 0);
            CHECK(st.subflows == 1);
        }
        CHECK(mib_sum(lab, "MPJoinNoTokenFound") - no_token0 == 0);
        CHECK(mib_sum(lab, "MPJoinSynRx") - syn_rx0 == 2 * kOld);
        CHECK(s2.accepted() == at_two);
    }

    // A record of the backends that makes no sense (a local file is not trusted): the next
    // agent starts a new balancer instead of taking the pinned one over, and it serves.
    CHECK(agent.stop() == 0);
    std::ofstream(agent.state_dir() + "/state/balancer.json") << "{\"subflows\": [\x01";
    agent.start();
    REQUIRE(agent.wait_status(
        [](const nlohmann::json& s) {
            return s.value("ready", false) && s["balancer"].is_object() &&
                   s["balancer"]["counters"].value("packets", 1) == 0;  // new tables
        },
        60s, 20ms));
    joins_through(5);

    // No balancer in the revision: its interfaces go to the policy's XDP entry.
    agent.publish({{"policy.yaml", kEverywhere}});
    REQUIRE(agent.wait_status(
        [](const nlohmann::json& s) { return s.value("ready", false) && s["balancer"].is_null(); },
        20s, 20ms));
    CHECK(policy_link(agent.status(), lab.router_client_if(1), "xdp"));
    CHECK(policy_link(agent.status(), lab.router_client_if(2), "xdp"));

    // And back: the policy's entry yields them to the balancer, which serves again.
    agent.publish({{"balancer.yaml", balancer_manifest(lab, 2)}, {"policy.yaml", kEverywhere}});
    REQUIRE(agent.wait_status(balancer_with(2), 20s, 20ms));
    CHECK_FALSE(policy_link(agent.status(), lab.router_client_if(1), "xdp"));
    joins_through(10);

    // Without a revision naming it, nothing of the balancer stays.
    agent.publish({{"README.txt", "nothing here\n"}});
    REQUIRE(agent.wait_status(
        [](const nlohmann::json& s) { return s.value("ready", false) && s["balancer"].is_null(); },
        20s, 20ms));
    CHECK_FALSE(xdp_on(lab.router_ns(), lab.router_client_if(1)));
    CHECK_FALSE(xdp_on(lab.router_ns(), lab.router_client_if(2)));
    CHECK(agent.alive());

    // `mpsteer reset` takes down a balancer its stopped agent left running.
    agent.publish({{"balancer.yaml", balancer_manifest(lab, 2)}});
    REQUIRE(agent.wait_status(balancer_with(2), 20s, 20ms));
    CHECK(agent.stop() == 0);
    REQUIRE(xdp_on(lab.router_ns(), lab.router_client_if(1)));
    // A backend's interface gone while no agent ran: the next agent cannot take the balancer
    // over, applies the revision again and reports why it stalls.
    must({"ip", "-n", lab.router_ns(), "link", "del", lab.router_backend_if(2)});
    agent.start();
    REQUIRE(agent.wait_status(
        [&](const nlohmann::json& s) {
            return !s.value("ready", true) &&
                   s["errors"].dump().find("interface '" + lab.router_backend_if(2) +
                                           "' does not exist on this host") != std::string::npos;
        },
        60s, 20ms));
    CHECK(agent.stop() == 0);

    // From the host's namespaces: `ip netns exec` would hide the bpffs.
    must({agent_e2e::mpsteer_bin(), "reset", "--pin-root", agent.pin_root(), "--state-dir",
          agent.state_dir()});
    CHECK_FALSE(xdp_on(lab.router_ns(), lab.router_client_if(1)));
    CHECK_FALSE(xdp_on(lab.router_ns(), lab.router_client_if(2)));
    CHECK_FALSE(std::filesystem::exists(agent.pin_root() + "/lb"));
}
