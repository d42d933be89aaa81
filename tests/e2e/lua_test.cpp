// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Lua hooks end to end: the agent, run on the lab's client with the shipped
// small-flow policy (policies/small-flow-pm.yaml + lua/small_flow_pm.lua), against the
// kernel's MPTCP. With the decision left to the hook: a 100 KB upload completes on its one
// subflow (the server's ADD_ADDR stays hidden); a 50 MB upload gets its second subflow once
// it has passed the 220 KB threshold (the hook asks add_subflow to re-inject the stored
// announcement). As shipped (add_subflow after_bytes), a download's client stack takes the
// announcement within 10 % of the threshold and the hook writes nothing. Then a revision whose
// script loops forever: the hook is disabled and shown in `mpsteer status` (Degraded:
// LuaHookDisabled) while the generation keeps working; the next revision's fixed script runs.
// And a hook that flips a set_backup action's B in place (agent on the server). The event
// thread (lua::EventThread) in each polling mode, alone and inside the agent.
#include <catch2/catch.hpp>

#include <linux/mptcp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "agent_harness.h"
#include "datapath/datapath.h"
#include "lab/lab.h"
#include "lua/datapath_backend.h"
#include "lua/event_thread.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// The shipped small-flow policy with the decision left to its Lua hook (add_subflow without
// after_bytes): the request path scripts that decide for themselves rely on.
std::string hook_decides_policy() {
    std::string p = source("policies/small-flow-pm.yaml");
    const std::string in_datapath = "add_subflow: {after_bytes: 220KB}";
    const auto at = p.find(in_datapath);
    if (at == std::string::npos)
        throw std::runtime_error("policies/small-flow-pm.yaml no longer has " + in_datapath);
    return p.replace(at, in_datapath.size(), "add_subflow: {}");
}

}  // namespace

TEST_CASE(
    "lua: small-flow policy keeps 100 KB on one subflow, its hook opens the second for 50 MB "
    "after the threshold",
    "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lu" + std::to_string(getpid() % 10000);
    cfg.path[0] = cfg.path[1] = PathShape{0, 100000};  // 100 Mbit/s: 50 MB in a few seconds
    Lab lab(cfg);
    AgentHarness agent(lab, "lua", 10, /*client_side=*/true);
    agent.publish({{"policies/small-flow-pm.yaml", hook_decides_policy()},
                   {"lua/small_flow_pm.lua", source("lua/small_flow_pm.lua")}});
    agent.start();
    bool ready = agent.wait_status(
        [](const json& s) {
            return s.value("ready", false) && hook_of(s, "small-flow-single-path");
        },
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
        for (const auto& e : mon.poll(50ms)) joined |= e.type == MPTCP_EVENT_SUB_ESTABLISHED;
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
        // Joins to the second address, with the bytes received when each was seen; the one of
        // this connection is picked by its token once the sender knows it (an event of an
        // earlier connection may still arrive here).
        struct Join {
            MptcpEvent ev;
            uint64_t bytes;
            double ms;
        };
        std::vector<Join> joins;
        auto this_join = [&]() -> const Join* {
            for (const auto& j : joins)
                if (sent.token && j.ev.token == sent.token) return &j;
            return nullptr;
        };
        std::atomic<bool> sent_done{false};
        while (Clock::now() - t0 < 30s && !(sent_done && this_join())) {
            for (const auto& e : mon.poll(5ms))
                if (e.type == MPTCP_EVENT_SUB_ESTABLISHED && e.daddr == Lab::server_addr(2))
                    joins.push_back(
                        {e, sink.bytes_so_far(),
                         std::chrono::duration<double, std::milli>(Clock::now() - t0).count()});
            if (!sent_done && sender.joinable() && sink.bytes_so_far() >= 50'000'000) {
                sender.join();
                sent_done = true;
            }
        }
        if (sender.joinable()) sender.join();
        REQUIRE(error.empty());
        TrafficStats got = sink.wait(30s);
        CHECK(got.bytes == 50'000'000);
        CHECK(got.checksum == sent.checksum);
        CHECK_FALSE(sent.fallback);
        for (const auto& j : joins)
            UNSCOPED_INFO("join " << to_string(j.ev) << " at " << j.bytes << " bytes");
        INFO("this connection's token " << sent.token);
        const Join* mine = this_join();
        REQUIRE(mine);
        std::optional<uint64_t> at_join = mine->bytes;
        const double join_ms = mine->ms;
        std::printf(
            "small-flow e2e: 50 MB in %.2f s; second subflow at %.1f ms, %llu bytes "
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
    std::string looping =
        source("lua/small_flow_pm.lua") + "\nfunction on_tick() while true do end end\n";
    agent.publish({{"policies/small-flow-pm.yaml", hook_decides_policy()},
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
    CHECK(hook_of(s, "small-flow-single-path")
              ->value("last_error", "")
              .find("instruction budget exceeded") != std::string::npos);
    auto text = run({mpsteer_bin(), "status", "--state-dir", agent.state_dir()});
    INFO(text.out);
    CHECK(text.out.find("small-flow-single-path lua/small_flow_pm.lua disabled") !=
          std::string::npos);
    CHECK(agent.alive());
    {
        Sink sink(lab.server_ns(), 5203);
        TrafficStats sent =
            send_stream(lab.client_ns(), Lab::server_addr(1), 5203, SendOptions::of_bytes(100000));
        CHECK(sink.wait(15s).checksum == sent.checksum);
        CHECK(sent.subflows == 0);  // blk_subflow still hides the announcement
    }
    // A hostile revision: _G raises on every lookup and the hook's error is not UTF-8. The
    // agent stays up, reports the script, and its status stays valid JSON.
    std::string hostile = source("lua/small_flow_pm.lua") +
                          "\nfunction on_tick() error('\\255\\254 bad') end\n"
                          "setmetatable(_G, {__index = function() error('no') end})\n";
    agent.publish({{"policies/small-flow-pm.yaml", hook_decides_policy()},
                   {"lua/small_flow_pm.lua", hostile}});
    REQUIRE(agent.wait_status(
        [](const json& st) {
            const json* h = hook_of(st, "small-flow-single-path");
            return h && (*h)["state"] == "disabled" &&
                   h->value("last_error", "").find("bad") != std::string::npos;
        },
        10s, 50ms));
    s = agent.status();
    INFO(s.dump(1));
    bool named = false;
    for (const auto& c : s["conditions"])
        named |= c.value("type", "") == "Degraded" && c.value("status", false) &&
                 c.value("message", "").find("small-flow-single-path") != std::string::npos;
    CHECK(named);
    CHECK(agent.alive());
    // The fixed script in the next revision is loaded afresh and runs.
    agent.publish({{"policies/small-flow-pm.yaml", hook_decides_policy()},
                   {"lua/small_flow_pm.lua", source("lua/small_flow_pm.lua")}});
    CHECK(agent.wait_status(
        [](const json& st) {
            const json* h = hook_of(st, "small-flow-single-path");
            return h && (*h)["state"] == "running" && (*h)["failures"] == 0 &&
                   (*h)["calls"].get<uint64_t>() > 0;
        },
        10s, 50ms));
}

// As shipped, the datapath decides: add_subflow re-injects the announcement on the packet that
// takes the connection past 220 KB. A 2 MB download at 20 Mbit/s (2.5 KB a millisecond, so a
// 1 ms poll of the kernel's events sees the byte count to about 1 %): the client's stack takes
// the ADD_ADDR (MPTCP "announced") within 10 % of the threshold, and the hook has nothing to do.
// Three runs: the carrier must survive the segments that overtake it (bpf/ACTORS.md).
TEST_CASE("lua: shipped small-flow policy opens the second subflow within 10 % of the threshold",
          "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lt" + std::to_string(getpid() % 10000);
    cfg.path[0] = cfg.path[1] = PathShape{0, 20000};
    Lab lab(cfg);
    AgentHarness agent(lab, "luat", 10, /*client_side=*/true);
    agent.publish({{"policies/small-flow-pm.yaml", source("policies/small-flow-pm.yaml")},
                   {"lua/small_flow_pm.lua", source("lua/small_flow_pm.lua")}});
    agent.start();
    REQUIRE(agent.wait_status(
        [](const json& s) {
            return s.value("ready", false) && hook_of(s, "small-flow-single-path");
        },
        90s, 20ms));
    const uint64_t threshold = 220000;
    for (int run = 0; run < 3; run++) {
        INFO("run " << run + 1);
        const uint16_t port = uint16_t(5211 + run);
        MptcpMonitor mon(lab.client_ns());
        Source source(lab.server_ns(), port, SendOptions::of_bytes(2'000'000));
        std::atomic<uint64_t> got{0};
        std::atomic<bool> done{false};
        TrafficStats rx;
        std::string error;
        std::thread reader([&] {
            try {
                rx = receive_stream(lab.client_ns(), Lab::server_addr(1), port, 30s,
                                    [&](uint64_t n) { got = n; });
            } catch (const std::exception& e) {
                error = e.what();
            }
            done = true;
        });
        std::optional<uint64_t> announced_at, established_at;
        while (!done)
            for (const auto& e : mon.poll(1ms)) {
                if (e.type == MPTCP_EVENT_ANNOUNCED && !announced_at) announced_at = got.load();
                if (e.type == MPTCP_EVENT_SUB_ESTABLISHED && !established_at)
                    established_at = got.load();
            }
        reader.join();
        REQUIRE(error.empty());
        TrafficStats tx = source.wait(10s);
        CHECK(rx.bytes == 2'000'000);
        CHECK(rx.checksum == tx.checksum);
        CHECK_FALSE(rx.fallback);
        REQUIRE(announced_at);
        REQUIRE(established_at);
        std::printf(
            "small-flow e2e (datapath): 2 MB download, ADD_ADDR taken after %llu bytes, "
            "second subflow up after %llu bytes (threshold %llu)\n",
            static_cast<unsigned long long>(*announced_at),
            static_cast<unsigned long long>(*established_at),
            static_cast<unsigned long long>(threshold));
        CHECK(*announced_at >= threshold * 9 / 10);
        CHECK(*announced_at <= threshold * 11 / 10);
    }
    // The hook found every announcement released by the datapath: no write of its own.
    REQUIRE(agent.wait_status(
        [](const json& st) {
            const json* h = hook_of(st, "small-flow-single-path");
            return h && (*h)["calls"].get<uint64_t>() >= 10;
        },
        5s, 50ms));
    const json st = agent.status();
    const json* h = hook_of(st, "small-flow-single-path");
    REQUIRE(h);
    CHECK((*h)["writes"] == 0);
    CHECK((*h)["failures"] == 0);
}

// The shipped path-resilience policy on the client: path 1's link goes down under a download
// and comes back; the hook hears it (on_link) and renews path 1's endpoint, so a new subflow
// over it is established within 3 s of the return (the kernel alone waits for the old
// subflow's retransmission timer: about 5 s, docs/use-cases.md). Then a script that renews an
// endpoint on every 10 ms tick: the agent carries out at most one renewal per endpoint every
// 500 ms and counts the rest as refused.
TEST_CASE("lua: shipped path-resilience policy re-creates the subflow over a path that returns",
          "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lr" + std::to_string(getpid() % 10000);
    cfg.signal = false;
    cfg.path[0] = cfg.path[1] = PathShape{10, 20000};
    Lab lab(cfg);
    const std::string cli = lab.client_ns();
    for (int path : {1, 2})
        must({"ip", "-n", cli, "mptcp", "endpoint", "add", Lab::client_addr(path), "dev",
              lab.client_if(path), "subflow"});
    for (const std::string& ns : {cli, lab.server_ns()})
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "4", "add_addr_accepted", "2"});
    AgentHarness agent(lab, "lres", 10, /*client_side=*/true);
    agent.publish({{"policies/path-resilience.yaml", source("policies/path-resilience.yaml")},
                   {"lua/path_resilience.lua", source("lua/path_resilience.lua")}});
    agent.start();
    REQUIRE(agent.wait_status(
        [](const json& s) { return s.value("ready", false) && hook_of(s, "path-resilience"); }, 90s,
        20ms));

    MptcpMonitor mon(cli);
    const uint16_t port = 5231;
    Source sender(lab.server_ns(), port, SendOptions::of_time(9s));
    TrafficStats rx;
    std::string error;
    std::atomic<bool> done{false};
    std::thread reader([&] {
        try {
            rx = receive_stream(cli, Lab::server_addr(1), port, 60s, nullptr);
        } catch (const std::exception& e) {
            error = e.what();
        }
        done = true;
    });
    const auto t0 = Clock::now();
    std::optional<Clock::time_point> up_at;
    std::optional<double> back_after;
    bool down = false;
    while (!done) {
        const auto now = Clock::now();
        if (!down && now - t0 >= 2s) {
            must({"ip", "-n", cli, "link", "set", lab.client_if(1), "down"});
            down = true;
        }
        if (down && !up_at && now - t0 >= 4s) {
            must({"ip", "-n", cli, "link", "set", lab.client_if(1), "up"});
            up_at = Clock::now();
        }
        for (const auto& e : mon.poll(10ms))
            if (up_at && !back_after && e.type == MPTCP_EVENT_SUB_ESTABLISHED &&
                e.saddr == Lab::client_addr(1))
                back_after = std::chrono::duration<double>(Clock::now() - *up_at).count();
    }
    reader.join();
    if (down && !up_at) must({"ip", "-n", cli, "link", "set", lab.client_if(1), "up"});
    REQUIRE(error.empty());
    const TrafficStats tx = sender.wait(10s);
    CHECK(rx.bytes == tx.bytes);
    CHECK(rx.checksum == tx.checksum);
    CHECK_FALSE(rx.fallback);
    REQUIRE(back_after);
    std::printf("path-resilience e2e: a new subflow over path 1 %.2f s after its link came up\n",
                *back_after);
    CHECK(*back_after <= 3.0);
    REQUIRE(agent.wait_status(
        [](const json& s) {
            for (const auto& r : s.value("endpoint_renewals", json::array()))
                if (r.value("address", "") == Lab::client_addr(1) && r["renewals"] >= 1)
                    return true;
            return false;
        },
        5s, 50ms));
    const json after_return = agent.status();
    const json* h = hook_of(after_return, "path-resilience");
    REQUIRE(h);
    CHECK((*h)["failures"] == 0);

    // A script that renews on every tick: the agent's bound holds. Without idle_every: the
    // download is over, and an idle host would tick once a second instead of every 10 ms.
    std::string flood = source("policies/path-resilience.yaml");
    flood.replace(flood.find("every: 200ms"), 12, "every: 10ms");
    flood.erase(flood.find("    idle_every: 1s\n"), 19);
    const auto published = Clock::now();
    agent.publish({{"policies/path-resilience.yaml", flood},
                   {"lua/path_resilience.lua", "function on_tick() mpsteer.renew_endpoint('" +
                                                   Lab::client_addr(2) + "') end\n"}});
    json st;
    const bool bounded = agent.wait_status(
        [&](const json& s) {
            for (const auto& r : s.value("endpoint_renewals", json::array()))
                if (r.value("address", "") == Lab::client_addr(2) && r["refused"] >= 100) {
                    st = r;
                    return true;
                }
            return false;
        },
        30s, 50ms);
    INFO(agent.status().dump());
    INFO(agent.log_tail());
    REQUIRE(bounded);
    const double seconds = std::chrono::duration<double>(Clock::now() - published).count();
    INFO(st.dump());
    CHECK(st["renewals"].get<double>() <= seconds / 0.5 + 1);
    CHECK(agent.alive());
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
        std::printf(
            "lua set_policy_backup e2e: path-2 share %.1f %% as backup, %.1f %% after the "
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

namespace {
// n MPTCP connections from the client, each long enough (500 KB) to open its second subflow
// to the server's announced address even on busy CPUs.
void connections(const Lab& lab, int n, uint16_t port0) {
    for (int i = 0; i < n; ++i) {
        uint16_t port = uint16_t(port0 + i);
        Sink sink(lab.server_ns(), port);
        send_stream(lab.client_ns(), Lab::server_addr(1), port, SendOptions::of_bytes(500000));
        sink.wait(10s);
    }
}

uint64_t calls_of(const std::vector<lua::ScriptStatus>& st, const std::string& policy) {
    for (const auto& s : st)
        if (s.policy == policy) return s.calls;
    return 0;
}
}  // namespace

TEST_CASE("lua: the event thread runs the hooks in each mode: ticks, calls, a failing hook, stop",
          "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lt" + std::to_string(getpid() % 10000);
    Lab lab(cfg);
    Steering steer(server_chains(lab, 0), lab.server_ns(), Steering::pin_root_for("luathread"));
    const auto mode = GENERATE(lua::PollMode::wait, lua::PollMode::adaptive, lua::PollMode::spin);
    INFO("mode " << lua::to_string(mode));
    lua::FlowIds ids;
    lua::StepWriteQueue step_writes;
    lua::DatapathBackend backend(steer.state(), ids, step_writes);
    lua::HookSet hooks(backend);
    lua::HookDispatcher dispatcher(ids);
    const std::vector<lua::ScriptSpec> specs = {
        {"conn", "lua/conn.lua", "function on_connection(c) return {rate = 2500000} end\n", 0,
         json::object()},
        {"join", "lua/join.lua", "function on_subflow(sf) return {rate = 1250000} end\n", 0,
         json::object()},
        {"fails", "lua/fails.lua", "function on_subflow(sf) error('boom') end\n", 0,
         json::object()},
        {"tick", "lua/tick.lua", "n = 0\nfunction on_tick() n = n + 1 end\n", 10, json::object()}};
    lua::EventThreadOptions o;
    o.mode = mode;
    o.spin = std::chrono::microseconds(500);
    std::unique_ptr<lua::EventThread> et;
    {
        NetnsGuard in(lab.server_ns());
        et = std::make_unique<lua::EventThread>(steer.state(), dispatcher, hooks, o);
    }
    // call() runs on the event thread, and returns what it returns.
    const pid_t tid = et->call([] { return pid_t(gettid()); });
    CHECK(tid == et->tid());
    CHECK(tid != gettid());
    et->call([&] { hooks.configure(specs, "r1", 1); });
    // An exception in a task reaches the caller; the thread carries on.
    CHECK_THROWS_WITH(et->call([]() -> int { throw std::runtime_error("task failed"); }),
                      "task failed");

    const int n = 6;
    connections(lab, n, uint16_t(7000 + 100 * int(mode)));
    std::vector<lua::ScriptStatus> st;
    const auto deadline = Clock::now() + 5s;
    do {  // the last join's event may still be on its way
        std::this_thread::sleep_for(50ms);
        st = et->call([&] { return hooks.status(); });
    } while (calls_of(st, "join") < 3 && Clock::now() < deadline);
    const auto stats = et->stats();
    const auto events = et->take_events();

    // Every connection reached on_connection exactly once (its later MP_CAPABLE events repeat
    // the keys), the joins reached on_subflow, and the writes went through.
    const uint64_t joins = calls_of(st, "join");
    CHECK(calls_of(st, "conn") == uint64_t(n));
    REQUIRE(joins >= 3);
    for (const auto& s : st) {
        if (s.policy == "conn") CHECK(s.writes == uint64_t(n));
        if (s.policy == "join") CHECK(s.writes == joins);
        if (s.policy == "fails") {  // contained: disabled after 3, the others carried on
            CHECK(s.disabled);
            CHECK(s.failures == 3);
            CHECK_THAT(s.last_error, Catch::Contains("boom"));
        }
        if (s.policy == "tick") CHECK(s.calls >= 5);
    }
    CHECK(stats.ticks >= 5);
    CHECK(stats.dispatch_errors == 0);
    CHECK(stats.events >= uint64_t(3 * n));
    CHECK(stats.latency.count() >= uint64_t(n) + joins);
    CHECK(stats.latency.percentile_us(99) > 0);
    if (mode == lua::PollMode::spin) {
        CHECK(stats.events_while_polling == stats.events);
        CHECK(stats.wakeups == 0);
    }
    if (mode == lua::PollMode::wait) CHECK(stats.wakeups > 0);
    // The owner got each event afterwards.
    CHECK(events.size() >= stats.events);

    // Stop: joins promptly; afterwards call() runs on the caller's thread, and the hooks are
    // the caller's again.
    const auto t0 = Clock::now();
    et->stop();
    CHECK(Clock::now() - t0 < 1s);
    CHECK(et->call([] { return pid_t(gettid()); }) == gettid());
    connections(lab, 1, uint16_t(7050 + 100 * int(mode)));
    std::this_thread::sleep_for(100ms);
    CHECK(calls_of(hooks.status(), "conn") == uint64_t(n));  // nobody took that one
    et.reset();
}

TEST_CASE("lua: the agent runs its hooks in each --events mode", "[e2e][lua]") {
    datapath::init_libbpf_logging();
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "lm" + std::to_string(getpid() % 10000);
    Lab lab(cfg);
    const std::string mode = GENERATE("wait", "adaptive", "spin");
    INFO("--events=" << mode);
    AgentHarness agent(lab, "luam", 10);  // on the server
    agent.extra_args = {"--events=" + mode, "--events-spin-us", "300"};
    const std::string policy =
        "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: observe}\nspec:\n"
        "  attach: {hooks: [xdp, tc_egress]}\n  priority: 100\n  select:\n"
        "    - packet_type: [any_mptcp]\n  actions:\n    - get_connect: {}\n"
        "    - get_subflow: {}\n  hooks:\n    script: lua/count.lua\n    every: 20ms\n";
    const std::string script =
        "conns, joins, ticks = 0, 0, 0\n"
        "function on_connection(c) conns = conns + 1 end\n"
        "function on_subflow(sf) joins = joins + 1 end\n"
        "function on_tick() ticks = ticks + 1 end\n";
    agent.publish({{"policies/p.yaml", policy}, {"lua/count.lua", script}});
    agent.start();
    REQUIRE(agent.wait_status([](const json& s) { return s.value("ready", false); }, 90s, 20ms));
    connections(lab, 3, 7200);
    // calls: 3 on_connection, on_subflow for the joins, on_tick every 20 ms.
    bool seen = agent.wait_status(
        [](const json& s) {
            const json* h = hook_of(s, "observe");
            return h && (*h)["calls"].get<uint64_t>() >= 20 && s.contains("event_thread") &&
                   s["event_thread"].value("events", 0) >= 9 &&
                   s["event_thread"]["latency_us"].value("count", 0) >= 3;
        },
        10s, 20ms);
    json s = agent.status();
    INFO(s.dump(1));
    INFO(agent.log_tail());
    REQUIRE(seen);
    CHECK(s["event_thread"]["mode"] == mode);
    CHECK(s["event_thread"]["latency_us"]["count"].get<uint64_t>() >= 3);
    CHECK((*hook_of(s, "observe"))["failures"] == 0);
    // The main loop still logs every event the thread took.
    std::ifstream log(agent.state_dir() + "/events.jsonl");
    int lines = 0;
    for (std::string l; std::getline(log, l);) ++lines;
    CHECK(lines >= 9);
    const auto t0 = Clock::now();
    agent.stop();  // SIGTERM (the harness would SIGKILL after 10 s)
    CHECK(Clock::now() - t0 < 5s);
    CHECK_THAT(agent.log_tail(), Catch::Contains("stopping"));
}
