// Lua hooks end to end (issue 6): the agent, run on the lab's client with the shipped
// small-flow policy (policies/small-flow-pm.yaml + lua/small_flow_pm.lua), against the
// kernel's MPTCP. A 100 KB upload completes on its one subflow (the server's ADD_ADDR stays
// hidden); a 50 MB upload gets its second subflow once it has passed the 220 KB threshold
// (the hook asks add_subflow to re-inject the stored announcement). Then a revision whose
// script loops forever: the hook is disabled and shown in `mpsteer status` (Degraded:
// LuaHookDisabled) while the generation keeps working; the next revision's fixed script runs.
#include <catch2/catch.hpp>

#include <linux/mptcp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent_harness.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

std::string source(const std::string& rel) {
    std::ifstream in(std::string(MPS_SOURCE_DIR) + "/" + rel);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

const json* hook_of(const json& s, const std::string& policy) {
    if (!s.contains("lua_hooks")) return nullptr;
    for (const auto& h : s.at("lua_hooks"))
        if (h.value("policy", "") == policy) return &h;
    return nullptr;
}

}  // namespace

TEST_CASE("lua: small-flow policy keeps 100 KB on one subflow, opens the second for 50 MB "
          "after the threshold",
          "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lu" + std::to_string(getpid() % 10000);
    cfg.path[0] = cfg.path[1] = PathShape{0, 100000};  // 100 Mbit/s: 50 MB in a few seconds
    Lab lab(cfg);
    AgentHarness agent(lab, "lua", 10, /*client_side=*/true);
    agent.publish({{"policies/small-flow-pm.yaml", source("policies/small-flow-pm.yaml")},
                   {"lua/small_flow_pm.lua", source("lua/small_flow_pm.lua")}});
    agent.start();
    bool ready = agent.wait_status(
        [](const json& s) { return s.value("ready", false) && hook_of(s, "small-flow-single-path"); },
        90s, 20ms);
    INFO(agent.log_tail());
    REQUIRE(ready);
    const uint64_t threshold = 220000;

    // 100 KB: one subflow, no join, no hook write.
    {
        MptcpMonitor mon(lab.client_ns());
        Sink sink(lab.server_ns(), 5201);
        TrafficStats sent =
            send_stream(lab.client_ns(), Lab::server_addr(1), 5201, SendOptions::of_bytes(100000));
        TrafficStats got = sink.wait(15s);
        CHECK(got.bytes == 100000);
        CHECK(got.checksum == sent.checksum);
        CHECK_FALSE(sent.fallback);
        CHECK(sent.token != 0);
        CHECK(sent.subflows == 0);
        std::this_thread::sleep_for(400ms);  // a few ticks: the hook must not open it late
        bool joined = false;
        for (const auto& e : mon.poll(50ms))
            joined |= e.type == MPTCP_EVENT_SUB_ESTABLISHED;
        CHECK_FALSE(joined);
        std::printf("small-flow e2e: 100 KB in %.1f ms, %u extra subflows\n", sent.seconds * 1e3,
                    sent.subflows);
    }
    // The status file is rewritten every second: wait for the one that saw the announcement.
    CHECK(agent.wait_status(
        [](const json& st) { return st["events"].value("add_addr_blocked", 0) >= 1; }, 3s, 50ms));
    json s = agent.status();
    REQUIRE(hook_of(s, "small-flow-single-path"));
    CHECK((*hook_of(s, "small-flow-single-path"))["writes"] == 0);

    // 50 MB: the second subflow appears, after the threshold.
    {
        MptcpMonitor mon(lab.client_ns());
        Sink sink(lab.server_ns(), 5202);
        TrafficStats sent;
        std::string error;
        auto t0 = Clock::now();
        std::thread sender([&] {
            try {
                sent = send_stream(lab.client_ns(), Lab::server_addr(1), 5202,
                                   SendOptions::of_bytes(50'000'000));
            } catch (const std::exception& e) {
                error = e.what();
            }
        });
        std::optional<uint64_t> at_join;
        double join_ms = 0;
        while (Clock::now() - t0 < 30s && !at_join) {
            for (const auto& e : mon.poll(5ms))
                if (e.type == MPTCP_EVENT_SUB_ESTABLISHED && e.daddr == Lab::server_addr(2)) {
                    at_join = sink.bytes_so_far();
                    join_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
                }
        }
        sender.join();
        REQUIRE(error.empty());
        TrafficStats got = sink.wait(30s);
        CHECK(got.bytes == 50'000'000);
        CHECK(got.checksum == sent.checksum);
        CHECK_FALSE(sent.fallback);
        REQUIRE(at_join);
        std::printf("small-flow e2e: 50 MB in %.2f s; second subflow at %.1f ms, %llu bytes "
                    "received by then (threshold %llu)\n",
                    sent.seconds, join_ms, static_cast<unsigned long long>(*at_join),
                    static_cast<unsigned long long>(threshold));
        CHECK(*at_join >= threshold);
        CHECK(*at_join < 50'000'000);
    }
    CHECK(agent.wait_status(
        [](const json& st) {
            const json* h = hook_of(st, "small-flow-single-path");
            return h && (*h)["writes"].get<uint64_t>() >= 1;
        },
        3s, 50ms));
    s = agent.status();
    const json* h = hook_of(s, "small-flow-single-path");
    REQUIRE(h);
    INFO(h->dump());
    CHECK((*h)["writes"] >= 1);
    CHECK((*h)["failures"] == 0);
    CHECK((*h)["state"] == "running");

    // A revision whose script loops forever: it is disabled after three budget overruns and
    // shown in `mpsteer status`; the generation keeps running and a transfer still works.
    std::string looping = source("lua/small_flow_pm.lua") + "\nfunction on_tick() while true do end end\n";
    agent.publish({{"policies/small-flow-pm.yaml", source("policies/small-flow-pm.yaml")},
                   {"lua/small_flow_pm.lua", looping}});
    bool disabled = agent.wait_status(
        [](const json& st) {
            const json* h = hook_of(st, "small-flow-single-path");
            return h && (*h)["state"] == "disabled";
        },
        10s, 50ms);
    s = agent.status();
    INFO(s.dump(1));
    REQUIRE(disabled);
    CHECK(s.value("ready", false));
    bool degraded = false;
    for (const auto& c : s["conditions"])
        degraded |= c.value("type", "") == "Degraded" && c.value("status", false) &&
                    c.value("reason", "") == "LuaHookDisabled";
    CHECK(degraded);
    CHECK(hook_of(s, "small-flow-single-path")->value("last_error", "").find(
              "instruction budget exceeded") != std::string::npos);
    auto text = run({mpsteer_bin(), "status", "--state-dir", agent.state_dir()});
    INFO(text.out);
    CHECK(text.out.find("small-flow-single-path lua/small_flow_pm.lua disabled") != std::string::npos);
    CHECK(agent.alive());
    {
        Sink sink(lab.server_ns(), 5203);
        TrafficStats sent =
            send_stream(lab.client_ns(), Lab::server_addr(1), 5203, SendOptions::of_bytes(100000));
        CHECK(sink.wait(15s).checksum == sent.checksum);
        CHECK(sent.subflows == 0);  // blk_subflow still hides the announcement
    }
    // The fixed script in the next revision is loaded afresh and runs.
    agent.publish({{"policies/small-flow-pm.yaml", source("policies/small-flow-pm.yaml")},
                   {"lua/small_flow_pm.lua", source("lua/small_flow_pm.lua")}});
    CHECK(agent.wait_status(
        [](const json& st) {
            const json* h = hook_of(st, "small-flow-single-path");
            return h && (*h)["state"] == "running" && (*h)["failures"] == 0 &&
                   (*h)["calls"].get<uint64_t>() > 0;
        },
        10s, 50ms));
}
