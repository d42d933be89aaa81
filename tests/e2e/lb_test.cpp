// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The MPTCP-aware balancer (bpf/lb.bpf.c) on a router in front of backends that have no address
// of their own to announce: every join the clients' path managers send to the VIP reaches the
// backend that owns its connection (0 MPJoinNoTokenFound), IPv4 and IPv6; forged joins reach
// no backend.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "lab/lab.h"
#include "lab/token_balancer.h"

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
