// Lua hooks end to end (issue 6): the agent, run on the lab's client with the shipped
// small-flow policy (policies/small-flow-pm.yaml + lua/small_flow_pm.lua), against the
// kernel's MPTCP. A 100 KB upload completes on its one subflow (the server's ADD_ADDR stays
// hidden); a 50 MB upload gets its second subflow once it has passed the 220 KB threshold
// (the hook asks add_subflow to re-inject the stored announcement). Then a revision whose
// script loops forever: the hook is disabled and shown in `mpsteer status` (Degraded:
// LuaHookDisabled) while the generation keeps working; the next revision's fixed script runs.
// And a hook that flips a set_backup action's B in place (agent on the server).
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

// A hook changes an actor's parameter in place: the server marks its path-2 subflow backup
// (set_backup B=1 on its ACKs), and after 4 s the script calls mpsteer.set_policy_backup(false):
// the step's B changes in the running generation and the now idle subflow gets MP_PRIO B=0
// from the actor's template, so the client moves data back onto it. No new generation.
TEST_CASE("lua: a hook flips set_backup in place and the client uses the path again",
          "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lp" + std::to_string(getpid() % 10000);
    cfg.path[0] = cfg.path[1] = PathShape{0, 20000};
    Lab lab(cfg);
    AgentHarness agent(lab, "luap", 10);  // on the server
    const std::string policy =
        "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: path2-backup}\nspec:\n"
        "  attach: {hooks: [tc_egress]}\n  priority: 100\n  select:\n    - dst: " +
        Lab::client_addr(2) +
        "\n  actions:\n    - set_backup: {backup: true}\n  hooks:\n    script: lua/restore.lua\n"
        "    every: 100ms\n    params: {after_ticks: 40}\n";
    const std::string script =
        "local n = 0\n"
        "function on_apply(i) n = 0 end\n"
        "function on_tick()\n"
        "  n = n + 1\n"
        "  if n == params.after_ticks then\n"
        "    mpsteer.log('info', 'restoring: ' .. mpsteer.set_policy_backup(false) .. ' step(s)')\n"
        "  end\n"
        "end\n";
    MptcpMonitor mon(lab.client_ns());
    agent.publish({{"policies/p.yaml", policy}, {"lua/restore.lua", script}});
    agent.start();
    REQUIRE(agent.wait_status([](const json& s) { return s.value("ready", false); }, 90s, 20ms));
    const auto t_ready = Clock::now();
    Sink sink(lab.server_ns(), 5201);
    TrafficStats sent;
    std::thread tx([&] {
        sent = send_stream(lab.client_ns(), Lab::server_addr(1), 5201,
                           SendOptions::of_time(std::chrono::milliseconds(9000)));
    });
    auto share2 = [&](std::chrono::milliseconds over) {
        auto acked = [&](int path) {
            uint64_t n = 0;
            for (const auto& s : tcp_subflows(lab.client_ns()))
                if (s.local.rfind(Lab::client_addr(path) + ":", 0) == 0) n += s.bytes_acked;
            return n;
        };
        uint64_t a1 = acked(1), a2 = acked(2);
        std::this_thread::sleep_for(over);
        uint64_t d1 = acked(1) - a1, d2 = acked(2) - a2;
        return d1 + d2 ? double(d2) / double(d1 + d2) : 0.0;
    };
    std::vector<Clock::time_point> prio;
    auto wait_prio = [&](std::chrono::milliseconds timeout) {
        auto end = Clock::now() + timeout;
        while (Clock::now() < end)
            for (const auto& e : mon.poll(20ms))
                if (e.type == MPTCP_EVENT_SUB_PRIORITY && e.saddr == Lab::client_addr(2)) {
                    prio.push_back(Clock::now());
                    return true;
                }
        return false;
    };
    bool b1 = wait_prio(3s);
    double backup_share = b1 ? share2(1500ms) : 1.0;
    bool b0 = b1 && wait_prio(6s);
    double restored = b0 ? (std::this_thread::sleep_for(300ms), share2(1500ms)) : 0.0;
    tx.join();
    TrafficStats got = sink.wait(30s);
    if (b0)
        std::printf("lua set_policy_backup e2e: path-2 share %.1f %% as backup, %.1f %% after the "
                    "hook's B=0 (%.1f s after Ready)\n",
                    100 * backup_share, 100 * restored,
                    std::chrono::duration<double>(prio[1] - t_ready).count());
    INFO(agent.log_tail());
    REQUIRE(b1);
    CHECK(backup_share < 0.05);
    REQUIRE(b0);
    CHECK(restored > 0.2);
    CHECK(got.checksum == sent.checksum);
    CHECK_FALSE(sent.fallback);
    json s = agent.status();
    CHECK(s.value("generation", 0) == 1);  // in place: no new generation
    const json* h = hook_of(s, "path2-backup");
    REQUIRE(h);
    CHECK((*h)["failures"] == 0);
    CHECK((*h)["writes"] == 1);
}
