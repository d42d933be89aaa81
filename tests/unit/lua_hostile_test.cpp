// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Hostile hook scripts (tests/unit/lua_hostile/*.lua): every escape from the sandbox's limits
// and every way to stall or crash the host that we know of. Each must end contained: the call
// returns within a bound, the script is reported with a clear, valid UTF-8 message, a
// well-behaved script next to it keeps running, and nothing crashes.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "hostile_scripts.h"
#include "lua/hooks.h"
#include "lua/step_writes.h"

using namespace mpsteer::lua;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

class FakeBackend : public Backend {
public:
    std::vector<Connection> conns;
    std::chrono::milliseconds connections_delay{0};  // a C function that takes its time
    std::vector<Connection> connections() override {
        std::this_thread::sleep_for(connections_delay);
        return conns;
    }
    std::optional<Connection> connection(uint32_t) override { return std::nullopt; }
    std::optional<Subflow> subflow(uint64_t) override { return std::nullopt; }
    bool set_subflow(const std::string&, uint64_t, const SubflowSettings&) override {
        return false;
    }
    bool add_subflow(const std::string&, uint32_t, uint8_t) override { return false; }
    bool block_address(const std::string&, uint32_t, uint8_t) override { return false; }
    int set_policy_backup(const std::string&, bool) override { return 0; }
};

Limits test_limits() {
    Limits l;
    l.instructions = 200'000;
    l.memory_bytes = 4u << 20;
    l.call_time = 500ms;
    return l;
}

const char* kGood = "n = 0\nfunction on_tick() n = n + 1 end\n";

// The message is valid UTF-8 (nlohmann's dump throws otherwise) and bounded.
void check_message(const ScriptStatus& st) {
    INFO(st.last_error.substr(0, 300));
    CHECK_NOTHROW(st.to_json().dump());
    CHECK(st.last_error.size() < 16384);
}

struct Case {
    const char* script;
    std::vector<const char*> expect;  // the last error contains one of these
};

}  // namespace

TEST_CASE("lua hostile: each script is contained and the others keep running", "[lua][hostile]") {
    const std::vector<Case> cases = {
        {"bad_utf8_error.lua", {"not UTF-8"}},
        {"xpcall_handler_loop.lua", {"instruction budget exceeded"}},
        {"gc_finalizer.lua", {"__gc finalizers are not allowed"}},
        {"gc_late_finalizer.lua", {"__gc finalizers are not allowed"}},
        {"find_backtrack.lua", {"string.find: pattern too costly"}},
        {"gmatch_backtrack.lua", {"string.gmatch: pattern too costly"}},
        {"gsub_backtrack.lua", {"string.gsub: pattern too costly"}},
        {"match_method_backtrack.lua", {"string.match: pattern too costly"}},
        {"connections_loop.lua", {"instruction budget exceeded"}},
        {"log_flood.lua", {"too many mpsteer calls"}},
        {"rep_bomb.lua", {"beyond the memory cap"}},
        {"concat_growth.lua", {"memory cap exceeded"}},
        {"table_growth.lua", {"memory cap exceeded", "instruction budget exceeded"}},
        {"deep_recursion.lua", {"stack overflow", "memory cap exceeded"}},
        {"coroutine_loop.lua", {"global 'coroutine'"}},
        {"mpsteer_metatable.lua", {"instruction budget exceeded"}},
        {"error_table_tostring.lua", {"(error object is a table value)"}},
        {"os_io_debug.lua", {"global 'os'"}},
        {"load_bytecode.lua", {"refused: ", "binary chunk"}},
        {"long_error.lua", {"more bytes cut"}},
        {"format_width.lua", {"invalid conversion"}},
        {"gsub_function_loop.lua", {"instruction budget exceeded"}},
        {"pairs_huge_table.lua", {"instruction budget exceeded"}},
        {"pcall_swallow.lua", {"instruction budget exceeded"}},
        {"string_metatable.lua", {"instruction budget exceeded"}},
        {"tostring_recursion.lua", {"stack overflow"}},
    };
    for (const auto& c : cases) {
        DYNAMIC_SECTION(c.script) {
            FakeBackend be;
            be.conns.resize(1000);  // connections() is work to pay for
            HookSet hs(be, test_limits());
            const auto t0 = Clock::now();
            hs.configure(
                {{"hostile", c.script, hostile_script(c.script), 1, nlohmann::json::object()},
                 {"good", "good.lua", kGood, 1, nlohmann::json::object()}},
                "r1", 1);
            for (int i = 1; i <= 4; ++i) hs.tick(Clock::now() + std::chrono::hours(i));
            // Every call is bounded by the budget or the time limit (500 ms): 3 failing calls
            // and a load, with room for a loaded machine.
            CHECK(Clock::now() - t0 < 6s);
            const Script* bad = hs.find("hostile");
            REQUIRE(bad);
            const ScriptStatus& st = bad->status();
            CHECK(st.disabled);
            CHECK(st.failures >= 1);
            bool matched = false;
            for (const char* e : c.expect) matched |= st.last_error.find(e) != std::string::npos;
            INFO(st.last_error.substr(0, 600));
            CHECK(matched);
            check_message(st);
            CHECK_NOTHROW(hs.status_json().dump());
            const ScriptStatus& good = hs.find("good")->status();
            CHECK_FALSE(good.disabled);
            CHECK(good.calls == 4);
            CHECK(good.failures == 0);
        }
    }
}

TEST_CASE("lua hostile: erroring metamethods on _G never reach the host unprotected",
          "[lua][hostile]") {
    FakeBackend be;
    HookSet hs(be, test_limits());
    hs.configure(
        {{"hostile", "g.lua", hostile_script("g_index_errors.lua"), 1, nlohmann::json::object()}},
        "r1", 1);
    Script* s = hs.find("hostile");
    REQUIRE(s);
    CHECK(s->status().loaded);
    CHECK_FALSE(s->has("on_connection"));  // absent: read raw, __index not run
    CHECK(s->has("on_tick"));
    CHECK(s->on_connection(Connection{}));
    CHECK(s->on_subflow(Subflow{}));
    CHECK(s->on_tick());
    CHECK(s->status().failures == 0);
}

TEST_CASE("lua hostile: print and log of invalid UTF-8 are sanitised", "[lua][hostile]") {
    FakeBackend be;
    Script s({"p", "p.lua",
              "function on_tick() print('\\255', {}, nil) mpsteer.log('warn', '\\192\\128 x') "
              "error('\\237\\160\\128 surrogate') end",
              0, nlohmann::json::object()},
             be, test_limits());
    REQUIRE(s.status().loaded);
    CHECK_FALSE(s.on_tick());
    CHECK(s.status().last_error.find("surrogate") != std::string::npos);
    CHECK(s.status().last_error.find("\xEF\xBF\xBD") != std::string::npos);
    check_message(s.status());
}

TEST_CASE("lua hostile: a loop is stopped by the wall-clock limit", "[lua][hostile]") {
    FakeBackend be;
    Limits l = test_limits();
    l.instructions = uint64_t(1) << 50;  // the budget would never end it
    l.call_time = 200ms;
    Script s({"p", "w.lua", hostile_script("wall_clock.lua"), 0, nlohmann::json::object()}, be, l);
    REQUIRE(s.status().loaded);
    const auto t0 = Clock::now();
    CHECK_FALSE(s.on_tick());
    CHECK(Clock::now() - t0 < 2s);
    CHECK(s.status().last_error.find("time limit exceeded (200 ms per call)") != std::string::npos);
}

TEST_CASE("lua hostile: a step written over and over queues one write, the latest",
          "[lua][hostile]") {
    StepWriteQueue q;
    for (int i = 0; i < 100000; ++i) q.push({{7, 3, i % 2 == 0}, {7, 4, true}});
    q.push({{8, 3, false}});
    auto w = q.take();
    REQUIRE(w.size() == 3);
    CHECK(w[0].generation == 7);
    CHECK(w[0].pc == 3);
    CHECK(w[0].backup == false);  // the last of the 100,000 (i = 99,999)
    CHECK(w[1].pc == 4);
    CHECK(w[2].generation == 8);
    CHECK(q.take().empty());
}

TEST_CASE("lua hostile: tostring and print show no addresses", "[lua][hostile]") {
    FakeBackend be;
    Script s({"p", "addr.lua",
              "function on_tick() error(tostring({}) .. ' ' .. tostring(print) .. ' ' ..\n"
              "  tostring(on_tick) .. ' ' .. tostring(setmetatable({}, {__tostring = function()\n"
              "  return 'mine' end}))) end\n",
              1, nlohmann::json::object()},
             be, test_limits());
    CHECK_FALSE(s.on_tick());
    INFO(s.status().last_error);
    CHECK(s.status().last_error.find("table function function mine") != std::string::npos);
    CHECK(s.status().last_error.find("0x") == std::string::npos);
}
