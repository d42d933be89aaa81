// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The hook process (src/lua/hook_process.h) with the built mpsteer binary and a fake backend:
// its confinement as the kernel reports it (/proc/PID/status), and the scripts that used to
// crash-loop, wedge or exhaust the agent: each one ends disabled with its reason while a
// well-behaved script beside it keeps running.
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "hostile_scripts.h"
#include "lua/hook_process.h"
#include "lua/hook_wire.h"

using namespace mpsteer::lua;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

class FakeBackend : public Backend {
public:
    std::atomic<uint64_t> writes{0};
    std::string last_policy;
    std::vector<Connection> connections() override { return {Connection{7, 8, 100, 1, 0, {}}}; }
    std::optional<Connection> connection(uint32_t) override { return std::nullopt; }
    std::optional<Subflow> subflow(uint64_t) override { return std::nullopt; }
    uint64_t last_rate = 0;
    bool set_subflow(const std::string&, uint64_t, const SubflowSettings& s) override {
        ++writes;
        last_rate = s.rate.value_or(0);
        return false;
    }
    bool add_subflow(const std::string&, uint32_t, uint8_t) override { return false; }
    bool block_address(const std::string&, uint32_t, uint8_t) override { return false; }
    int set_policy_backup(const std::string& policy, bool) override {
        ++writes;
        last_policy = policy;
        return 1;
    }
    std::vector<Endpoint> endpoints() override {
        return {{2, "10.0.2.1", "c2", true, false, false}};
    }
    std::vector<std::pair<std::string, std::string>> renewed;  // policy, address
    bool renew_endpoint(const std::string& policy, const std::string& address) override {
        ++writes;
        renewed.emplace_back(policy, address);
        return address == "10.0.2.1";
    }
};

HookProcessOptions options() {
    HookProcessOptions o;
    o.executable = MPSTEER_BIN;
    o.limits.call_time = 100ms;
    o.limits.memory_bytes = 64u << 20;
    o.grace = 200ms;
    return o;
}

// Counts on_tick calls in the good script's own state, read back through status().
const char* kGood = "n = 0\nfunction on_tick() n = n + 1; mpsteer.connections() end\n";

ScriptSpec spec(const std::string& policy, const std::string& source) {
    return {policy, policy + ".lua", source, 1, nlohmann::json::object(), 0};
}

const ScriptStatus* find(const std::vector<ScriptStatus>& all, const std::string& policy) {
    for (const auto& s : all)
        if (s.policy == policy) return &s;
    return nullptr;
}

// Ticks (every due on_tick) until pred holds or `limit` passes.
template <typename Pred>
bool tick_until(HookProcess& hp, Pred pred, std::chrono::seconds limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
        hp.tick(Clock::now() + 1h);
        if (pred()) return true;
    }
    return false;
}

std::string proc_status_field(pid_t pid, const std::string& field) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (line.rfind(field + ":", 0) == 0) {
            auto v = line.substr(field.size() + 1);
            return v.substr(v.find_first_not_of(" \t"));
        }
    return "";
}

}  // namespace

TEST_CASE("hook process: the scripts run confined, their calls served by the agent",
          "[lua][hook_process]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("good", kGood),
                  spec("writer", "function on_tick() mpsteer.set_policy_backup(true) end")},
                 "r1", 1);
    REQUIRE(tick_until(
        hp, [&] { return be.writes > 0; }, 5s));
    CHECK(be.last_policy == "writer");
    auto info = hp.info();
    REQUIRE(info.pid > 0);
    CHECK(info.restarts == 0);
    CHECK(info.no_new_privs);
    CHECK(info.capabilities_dropped);
    CHECK(proc_status_field(info.pid, "NoNewPrivs") == "1");
    CHECK(proc_status_field(info.pid, "CapEff") == "0000000000000000");
    CHECK(proc_status_field(info.pid, "CapPrm") == "0000000000000000");
#ifndef MPS_EMULATED  // qemu-user takes no seccomp filter
    CHECK(info.seccomp);
    CHECK(proc_status_field(info.pid, "Seccomp") == "2");
#endif
    if (getuid() == 0) {
        CHECK(info.uid != 0);
        CHECK(proc_status_field(info.pid, "Uid").rfind("0\t", 0) != 0);
    }
    auto st = hp.status();
    REQUIRE(find(st, "good"));
    CHECK(find(st, "good")->calls > 0);
    CHECK_FALSE(find(st, "good")->disabled);
    // Settings a hook returns travel with the call's answer and are carried out by the agent.
    hp.configure({spec("returner", "function on_subflow(s) return {rate = 1000 + s.id} end")}, "r2",
                 2);
    const auto before = be.writes.load();
    Subflow sf;
    sf.id = 5;
    hp.on_subflow(sf);
    CHECK(be.writes == before + 1);
    CHECK(be.last_rate == 1005);
}

TEST_CASE("hook process: an event no script has a hook for is not sent to it",
          "[lua][hook_process]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("returner", "function on_subflow(s) return {rate = 1000 + s.id} end")}, "r1",
                 1);
    Subflow sf;
    sf.id = 5;
    const auto before = hp.info().requests;
    hp.on_subflow_closed(sf);
    hp.on_connection(Connection{});
    hp.on_link(Link{"c1", true});
    CHECK(hp.info().requests == before);
    hp.on_subflow(sf);
    CHECK(hp.info().requests == before + 1);
    CHECK(be.last_rate == 1005);
    // A script that ticks slower while idle hears every event: the process wakes it after one.
    ScriptSpec idle = spec("idle", kGood);
    idle.idle_every_ms = 60000;
    hp.configure({spec("returner", "function on_subflow(s) return {rate = 1000 + s.id} end"), idle},
                 "r2", 2);
    const auto configured = hp.info().requests;
    hp.on_subflow_closed(sf);
    CHECK(hp.info().requests == configured + 1);
    // The hooks a revision's scripts define replace the last ones.
    hp.configure({spec("closer", "function on_subflow_closed(s) end")}, "r3", 3);
    const auto third = hp.info().requests;
    hp.on_subflow(sf);
    CHECK(hp.info().requests == third);
    hp.on_subflow_closed(sf);
    CHECK(hp.info().requests == third + 1);
}

TEST_CASE(
    "hook process: a call stuck in one library call is killed at its budget, the script "
    "disabled, the others run on",
    "[lua][hook_process][hostile]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("good", kGood), spec("sorter", hostile_script("sort_loop.lua"))}, "r1", 1);
    const auto t0 = Clock::now();
    REQUIRE(tick_until(
        hp, [&] { return hp.info().restarts > 0; }, 30s));
    auto st = hp.status();
    REQUIRE(find(st, "sorter"));
    CHECK(find(st, "sorter")->disabled);
    INFO(find(st, "sorter")->last_error);
    CHECK(find(st, "sorter")->last_error.find("ran past its 300 ms") != std::string::npos);
    CHECK(hp.info().last_restart.find("sorter") != std::string::npos);
    // The good script was loaded again in the new process and goes on.
    const auto calls = find(st, "good")->calls;
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "good")->calls > calls + 3; }, 5s));
    CHECK(hp.info().restarts == 1);
    CHECK(Clock::now() - t0 < 25s);
    // A new revision that changes the script gives it another chance; an unchanged one not.
    hp.configure({spec("good", kGood), spec("sorter", hostile_script("sort_loop.lua"))}, "r2", 2);
    CHECK(find(hp.status(), "sorter")->disabled);
    hp.configure({spec("good", kGood), spec("sorter", "function on_tick() end")}, "r3", 3);
    CHECK_FALSE(find(hp.status(), "sorter")->disabled);
}

TEST_CASE("hook process: each script call's budget runs from its own start",
          "[lua][hook_process]") {
    // Four scripts that each spend their whole Lua budget (100 ms) in one tick: the request
    // takes four budgets, more than one call's 300 ms, and nothing is killed.
    FakeBackend be;
    auto o = options();
    o.limits.instructions = 1ull << 40;  // only the time stops them
    HookProcess hp(be, o);
    std::vector<ScriptSpec> specs;
    for (int i = 0; i < 4; ++i)
        specs.push_back(spec("spinner" + std::to_string(i),
                             "function on_tick() local i = 0 while true do i = i + 1 end end"));
    hp.configure(specs, "r1", 1);
    const auto t0 = Clock::now();
    hp.tick(Clock::now() + 1h);
    CHECK(Clock::now() - t0 >= 400ms);
    CHECK(hp.info().restarts == 0);
    auto st = hp.status();
    for (int i = 0; i < 4; ++i) {
        const auto* s = find(st, "spinner" + std::to_string(i));
        REQUIRE(s);
        INFO(s->policy << ": " << s->last_error);
        CHECK(s->failures == 1);
        CHECK(s->last_error.find("ran past") == std::string::npos);
    }
}

TEST_CASE("hook process: a script that writes in a tight loop is refused, then disabled",
          "[lua][hook_process][hostile]") {
    FakeBackend be;
    auto o = options();
    o.writes_per_second = 200;
    o.limits.call_time = 2s;  // only the write budget may stop it, however loaded the machine
    HookProcess hp(be, o);
    hp.configure({spec("good", kGood), spec("flood", hostile_script("write_loop.lua"))}, "r1", 1);
    const auto t0 = Clock::now();
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "flood")->disabled; }, 10s));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    auto st = hp.status();
    INFO(find(st, "flood")->last_error);
    CHECK(find(st, "flood")->last_error.find("went on writing past 200 writes a second") !=
          std::string::npos);
    // What reached the backend stayed within the budget (a second more for the edges).
    CHECK(double(be.writes.load()) <= 200 * (seconds + 2));
    CHECK(hp.info().writes_refused > 0);
    CHECK_FALSE(find(st, "good")->disabled);
    CHECK(hp.info().restarts == 0);
}

TEST_CASE("hook process: link events reach the scripts; endpoint renewals are the agent's",
          "[lua][hook_process]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("paths", R"(
        function on_link(l)
          mpsteer.set_status({last = l.interface})
          for _, e in ipairs(mpsteer.endpoints()) do
            if e.interface == l.interface and l.up then
              assert(mpsteer.renew_endpoint(e.address) == true)
              assert(mpsteer.renew_endpoint("10.9.9.9") == false)
            end
          end
        end)")},
                 "r1", 1);
    hp.on_link({"c1", true});  // no endpoint on c1
    CHECK(be.renewed.empty());
    hp.on_link({"c2", true});
    using Renewal = std::pair<std::string, std::string>;
    CHECK(be.renewed == std::vector<Renewal>{{"paths", "10.0.2.1"}, {"paths", "10.9.9.9"}});
    auto st = hp.status();
    INFO(find(st, "paths")->last_error);
    CHECK(find(st, "paths")->failures == 0);
    CHECK(find(st, "paths")->published == nlohmann::json{{"last", "c2"}});
}

TEST_CASE("hook process: renewing endpoints in a tight loop is refused, then disabled",
          "[lua][hook_process][hostile]") {
    FakeBackend be;
    auto o = options();
    o.writes_per_second = 100;
    o.limits.call_time = 2s;
    HookProcess hp(be, o);
    hp.configure({spec("good", kGood), spec("prober",
                                            "function on_tick() while true do "
                                            "pcall(mpsteer.renew_endpoint, '10.0.2.1') end end")},
                 "r1", 1);
    const auto t0 = Clock::now();
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "prober")->disabled; }, 10s));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    CHECK(double(be.renewed.size()) <= 100 * (seconds + 2));
    CHECK_FALSE(find(hp.status(), "good")->disabled);
}

TEST_CASE("hook process: a script that allocates all it can is stopped by its cap",
          "[lua][hook_process][hostile]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("good", kGood), spec("hoarder", hostile_script("alloc_all.lua"))}, "r1", 1);
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "hoarder")->disabled; }, 20s));
    auto st = hp.status();
    CHECK_FALSE(find(st, "good")->disabled);
    const auto calls = find(st, "good")->calls;
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "good")->calls > calls + 3; }, 5s));
}

TEST_CASE("hook process: a process killed from outside is started again", "[lua][hook_process]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("good", kGood)}, "r1", 1);
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "good")->calls > 0; }, 5s));
    const pid_t first = hp.info().pid;
    REQUIRE(kill(first, SIGKILL) == 0);
    REQUIRE(tick_until(
        hp, [&] { return hp.info().restarts == 1 && hp.info().pid > 0; }, 5s));
    CHECK(hp.info().pid != first);
    CHECK(hp.info().last_restart.find("killed by") != std::string::npos);
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "good")->calls > 0; }, 5s));
    CHECK_FALSE(find(hp.status(), "good")->disabled);
}

TEST_CASE("hook process: stop signals meant for the agent's group leave it to the agent",
          "[lua][hook_process]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("good", kGood)}, "r1", 1);
    REQUIRE(tick_until(
        hp, [&] { return find(hp.status(), "good")->calls > 0; }, 5s));
    const pid_t pid = hp.info().pid;
    // What Ctrl-C, a hang-up, systemd's stop and `pkill -USR1 mpsteer` send every process.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) REQUIRE(kill(pid, sig) == 0);
    auto calls = [&]() -> uint64_t {
        const auto all = hp.status();  // a restarted process starts its scripts afresh
        const ScriptStatus* good = find(all, "good");
        return good ? good->calls : 0;
    };
    const uint64_t before = calls();
    tick_until(
        hp, [&] { return calls() > before + 3; }, 3s);
    CHECK(hp.info().restarts == 0);
    CHECK(calls() > before + 3);
    CHECK(hp.info().pid == pid);
    CHECK(kill(pid, 0) == 0);
}

// A stand-in for the hook host: a shell script that writes `bytes` to the agent's socket and
// then waits to be killed. Removed with its directory.
class FakeHost {
public:
    explicit FakeHost(const std::string& bytes)
        : dir_(fs::temp_directory_path() /
               ("mpsteer-hook-fake-" + std::to_string(getpid()) + "-" + std::to_string(next_++))) {
        fs::create_directories(dir_);
        std::ofstream out(path());
        out << "#!/bin/sh\nprintf '";
        for (unsigned char c : bytes) out << '\\' << std::oct << int(c) << std::dec;
        out << "' >&3\nexec sleep 30\n";
        out.close();
        fs::permissions(path(), fs::perms::owner_all);
    }
    ~FakeHost() { fs::remove_all(dir_); }
    std::string path() const { return (dir_ / "host").string(); }

    // A frame as hook_wire.h writes it.
    static std::string frame(const std::string& body, uint8_t version = wire::kVersion) {
        const uint32_t n = uint32_t(body.size() + 1);
        std::string f{char(n & 0xff), char(n >> 8 & 0xff), char(n >> 16 & 0xff), char(n >> 24)};
        return f + char(version) + body;
    }
    static std::string hello() {
        return frame(nlohmann::json{
            {"t", "hello"},
            {"uid", 65534},
            {"gid", 65534},
            {"no_new_privs", true},
            {"seccomp", true},
            {"capabilities_dropped",
             true}}.dump());
    }

private:
    fs::path dir_;
    static inline int next_ = 0;
};

TEST_CASE("hook process: a process that breaks the protocol is refused", "[lua][hook_process]") {
    // One that sends an oversized frame, one that answers its setup with a frame of another
    // version.
    for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
             {"huge", std::string("\xff\xff\xff\x7f", 4) + "x"},
             {"version", FakeHost::frame("{}", 2)}}) {
        INFO(name);
        FakeHost host(bytes);
        FakeBackend be;
        auto o = options();
        o.executable = host.path();
        const auto t0 = Clock::now();
        HookProcess hp(be, o);
        CHECK(hp.configure({spec("good", kGood)}, "r1", 1).empty());
        CHECK(hp.size() == 0);
        CHECK(hp.info().pid == 0);
        CHECK(Clock::now() - t0 < 5s);
    }
}

TEST_CASE(
    "hook process: answers of the wrong shape restart it; writes it has no right to are "
    "refused",
    "[lua][hook_process]") {
    using nlohmann::json;
    const auto done = [](json extra) {
        json d = {{"t", "done"}, {"calls", 0}, {"loaded", {"good"}}};
        d.update(extra);
        return FakeHost::hello() + FakeHost::frame(d.dump());
    };
    SECTION("fields of the wrong type: the process is restarted, the agent goes on") {
        for (const auto& [name, extra] : std::vector<std::pair<std::string, json>>{
                 {"hooks not names", {{"hooks", {1, json::object()}}}},
                 {"next not a time", {{"next", "soon"}}},
                 {"calls negative", {{"calls", -1}}},
                 {"writes not a list of calls", {{"writes", {"x"}}}},
                 {"loaded not names", {{"loaded", 5}}}}) {
            INFO(name);
            FakeHost host(done(extra));
            FakeBackend be;
            auto o = options();
            o.executable = host.path();
            HookProcess hp(be, o);
            CHECK(hp.configure({spec("good", kGood)}, "r1", 1).empty());
            CHECK(hp.info().restarts >= 1);
            CHECK(hp.info().last_restart.find("broke the protocol") != std::string::npos);
            CHECK(be.writes == 0);
        }
    }
    SECTION("a status answer without the status: the process is restarted") {
        FakeHost host(done(json::object()) +
                      FakeHost::frame(json{{"t", "done"}, {"calls", 0}}.dump()));
        FakeBackend be;
        auto o = options();
        o.executable = host.path();
        HookProcess hp(be, o);
        REQUIRE(hp.configure({spec("good", kGood)}, "r1", 1) == std::vector<std::string>{"good"});
        hp.status();
        CHECK(hp.info().restarts >= 1);
        CHECK(hp.info().last_restart.find("broke the protocol") != std::string::npos);
    }
    SECTION("returned settings for policies it was not given, or out of range, are not made") {
        const json writes = {
            {{"fn", "set_subflow"}, {"policy", "other"}, {"id", 1}, {"rate", 1000}},
            {{"fn", "set_policy_backup"}, {"policy", "../good"}, {"backup", true}},
            {{"fn", "set_subflow"}, {"policy", "good"}, {"id", -1}, {"rate", 1000}},
            {{"fn", "add_subflow"}, {"policy", "good"}, {"token", 1}, {"addr_id", 256}},
            {{"fn", "renew_endpoint"}, {"policy", "off"}, {"address", "10.0.2.1"}},
            {{"fn", "no_such_call"}, {"policy", "good"}}};
        FakeHost host(done({{"writes", writes}, {"hooks", {"on_connection", "not_a_hook"}}}));
        FakeBackend be;
        auto o = options();
        o.executable = host.path();
        HookProcess hp(be, o);
        CHECK(hp.configure({spec("good", kGood)}, "r1", 1) == std::vector<std::string>{"good"});
        CHECK(hp.info().restarts == 0);
        CHECK(be.writes == 0);
        CHECK(be.renewed.empty());
    }
}

TEST_CASE("hook process: a policy disabled for flooding gets no writes, whatever the process sends",
          "[lua][hook_process]") {
    using nlohmann::json;
    // The stand-in answers each request in turn: configure, then two ticks a second apart, the
    // agent's disable, the status, then a last tick. Two writes a second are allowed.
    const json one = {{"fn", "set_subflow"}, {"policy", "good"}, {"id", 1}, {"rate", 1000}};
    const auto done = [&](int writes) {
        json d = {{"t", "done"}, {"calls", 0}, {"next", 0}, {"loaded", {"good"}}};
        d["writes"] = json::array();
        for (int i = 0; i < writes; ++i) d["writes"].push_back(one);
        return FakeHost::frame(d.dump());
    };
    const auto status =
        FakeHost::frame(json{{"t", "done"}, {"calls", 0}, {"status", json::array()}}.dump());
    FakeHost host(FakeHost::hello() + done(3) + done(3) + done(1) + done(0) + status + done(1));
    FakeBackend be;
    auto o = options();
    o.executable = host.path();
    o.writes_per_second = 2;
    HookProcess hp(be, o);
    hp.configure({spec("good", kGood)}, "r1", 1);  // 3 writes: 2 made, 1 refused
    CHECK(be.writes == 2);
    std::this_thread::sleep_for(1100ms);
    hp.tick(Clock::now());  // over its budget a second time: 2 made
    CHECK(be.writes == 4);
    std::this_thread::sleep_for(1100ms);
    hp.tick(Clock::now());  // made, then the policy is disabled (the 4th answer)
    CHECK(be.writes == 5);
    const auto* st = find(hp.status(), "good");
    REQUIRE(st);
    CHECK(st->disabled);
    hp.tick(Clock::now());  // the process goes on writing for it: refused
    CHECK(be.writes == 5);
    CHECK(hp.info().restarts == 0);
}

TEST_CASE("hook process: a script's log lines reach the agent's log escaped and capped",
          "[lua][hook_process][hostile]") {
    auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096);
    auto before = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", ring));
    struct Restore {
        std::shared_ptr<spdlog::logger> l;
        ~Restore() { spdlog::set_default_logger(l); }
    } restore{before};
    FakeBackend be;
    auto o = options();
    o.log_lines_per_second = 20;
    HookProcess hp(be, o);
    hp.configure({spec("forger",
                       "function on_tick()\n"
                       "  mpsteer.log('warn', 'a\\n[error] forged line\\r\\27[31mred')\n"
                       "  for i = 1, 40 do print('line', i, {}) end\n"
                       "end\n")},
                 "r1", 1);
    hp.tick(Clock::now() + 1h);
    bool escaped = false;
    int lines = 0;
    for (const auto& line : ring->last_formatted()) {
        CHECK(line.find('\r') == std::string::npos);
        CHECK(line.find('\x1b') == std::string::npos);
        CHECK(line.find('\n') == line.size() - 1);  // one line: its own end only
        CHECK(line.find("0x") == std::string::npos);
        escaped |= line.find("a\\n[error] forged line\\r\\x1b[31mred") != std::string::npos;
        lines += line.find("line\\t") != std::string::npos;
        // print joins exactly its arguments (no trailing buffer slot)
        if (line.find("line\\t1\\t") != std::string::npos)
            CHECK(line.ends_with("line\\t1\\ttable\n"));
    }
    CHECK(escaped);
    CHECK(lines > 0);
    CHECK(lines <= 20);
    CHECK(hp.info().log_lines_dropped > 0);
}

// Not part of the test run: `build/tests/unit/hook_process_tests "[.bench]"` prints the round
// trip of one event through the hook process (a hook that returns a setting), back to back and
// with 1 ms between events (each then pays the wake-ups of both sides).
TEST_CASE("hook process: round trip of an event (benchmark)", "[.bench]") {
    FakeBackend be;
    HookProcess hp(be, options());
    hp.configure({spec("r", "function on_subflow(s) return {rate = 1000 + s.id} end")}, "r1", 1);
    for (auto gap : {0us, 1000us}) {
        std::vector<double> us;
        for (int i = 0; i < 2000; ++i) {
            Subflow sf;
            sf.id = uint64_t(i);
            const auto t0 = Clock::now();
            hp.on_subflow(sf);
            us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
            if (gap.count()) std::this_thread::sleep_for(gap);
        }
        std::sort(us.begin(), us.end());
        WARN(gap.count() << " us between events: round trip p50 " << us[us.size() / 2]
                         << " us, p99 " << us[us.size() * 99 / 100] << " us");
    }
    CHECK(be.last_rate == 1000 + 1999);
}
