// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Lua hooks without a kernel: the shipped scripts driven with synthetic events against a fake
// backend that records every write, and the sandbox's containment of hostile scripts.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>

#include "lua/event_thread.h"
#include "lua/hooks.h"

using namespace mpsteer::lua;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Write {
    std::string what;  // "rate", "backup", "add", "block"
    uint64_t target = 0, value = 0;
    bool operator==(const Write&) const = default;
};

class FakeBackend : public Backend {
public:
    std::vector<Connection> conns;
    bool none = false;  // what no_connections() says
    bool no_connections() override { return none; }
    std::vector<Write> writes;
    std::vector<Connection> connections() override { return conns; }
    std::optional<Connection> connection(uint32_t token) override {
        for (const auto& c : conns)
            if (c.token == token) return c;
        return std::nullopt;
    }
    std::optional<Subflow> subflow(uint64_t id) override {
        for (const auto& c : conns)
            for (const auto& s : c.subflows)
                if (s.id == id) return s;
        return std::nullopt;
    }
    bool set_subflow(const std::string&, uint64_t id, const SubflowSettings& s) override {
        if (!subflow(id)) return false;
        if (s.rate) writes.push_back({"rate", id, *s.rate});
        if (s.backup) writes.push_back({"backup", id, *s.backup});
        return true;
    }
    bool add_subflow(const std::string&, uint32_t token, uint8_t id) override {
        writes.push_back({"add", token, id});
        return true;
    }
    bool block_address(const std::string&, uint32_t token, uint8_t id) override {
        writes.push_back({"block", token, id});
        return true;
    }
    int set_policy_backup(const std::string&, bool b) override {
        writes.push_back({"policy_backup", 0, b});
        return 1;
    }
    std::vector<Endpoint> eps;
    std::vector<std::string> renewed;  // addresses, in order
    std::vector<Endpoint> endpoints() override { return eps; }
    bool renew_endpoint(const std::string&, const std::string& address) override {
        for (const auto& e : eps)
            if (e.address == address) {
                renewed.push_back(address);
                return true;
            }
        return false;
    }
    uint64_t rate_of(uint64_t id) const {
        for (auto it = writes.rbegin(); it != writes.rend(); ++it)
            if (it->what == "rate" && it->target == id) return it->value;
        return UINT64_MAX;
    }
};

std::string file(const std::string& rel) {
    std::ifstream in(std::string(MPS_SOURCE_DIR) + "/" + rel);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

ScriptSpec spec(const std::string& src, nlohmann::json params = nlohmann::json::object(),
                uint32_t every = 0, const std::string& policy = "p") {
    return {policy, "test.lua", src, every, std::move(params)};
}

Subflow sf(uint64_t id, uint32_t srtt, uint32_t rttvar, uint64_t cwnd, uint64_t inflight) {
    Subflow s;
    s.id = id;
    s.token = 0x1234;
    s.srtt_us = srtt;
    s.rttvar_us = rttvar;
    s.cwnd = cwnd;
    s.inflight = inflight;
    s.local = true;
    return s;
}

Limits small_limits() {
    Limits l;
    l.instructions = 200'000;
    l.memory_bytes = 4u << 20;
    l.max_failures = 3;
    return l;
}

}  // namespace

// ---- shipped scripts -----------------------------------------------------------------------

TEST_CASE("lua: small_flow_pm opens the hidden subflow only after the threshold",
          "[lua][scripts]") {
    FakeBackend be;
    Script s(spec(file("lua/small_flow_pm.lua"), {{"threshold_bytes", 220000}}, 100), be);
    REQUIRE(s.status().loaded);
    Connection c;
    c.token = 0xabcd;
    c.bytes = 1000;
    be.conns = {c};
    AddAddr a;
    a.token = 0xabcd;
    a.address = "10.0.2.2";
    a.addr_id = 1;
    REQUIRE(s.on_add_addr_blocked(a));
    REQUIRE(s.on_tick());
    CHECK(be.writes.empty());  // 1000 bytes: stays on one path
    be.conns[0].bytes = 219999;
    REQUIRE(s.on_tick());
    CHECK(be.writes.empty());
    be.conns[0].bytes = 220000;
    REQUIRE(s.on_tick());
    REQUIRE(be.writes == std::vector<Write>{{"add", 0xabcd, 1}});
    REQUIRE(s.on_tick());  // once only
    CHECK(be.writes.size() == 1);
    // A connection that closed before it grew is forgotten without a write.
    a.token = 0x7777;
    REQUIRE(s.on_add_addr_blocked(a));
    REQUIRE(s.on_tick());
    CHECK(be.writes.size() == 1);
    CHECK(s.status().failures == 0);
}

TEST_CASE("lua: small_flow_pm forgets announcements of unknown connections", "[lua][scripts]") {
    FakeBackend be;
    Script s(spec(file("lua/small_flow_pm.lua"), {{"threshold_bytes", 500}}, 100), be);
    AddAddr a;  // token 0: the connection's keys were not seen yet
    a.address = "10.0.2.2";
    a.addr_id = 1;
    REQUIRE(s.on_add_addr_blocked(a));
    REQUIRE(s.on_tick());
    CHECK(be.writes.empty());
}

TEST_CASE("lua: ecf holds the slow path back (backup) while waiting for the fast one pays off",
          "[lua][scripts]") {
    FakeBackend be;
    Script s(
        spec(file("lua/ecf.lua"), {{"beta", 0.25}, {"hold_ticks", 3}, {"resignal_ticks", 10}}, 20),
        be);
    REQUIRE(s.status().loaded);
    using W = std::vector<Write>;
    const Write hold{"policy_backup", 0, 1}, use{"policy_backup", 0, 0};
    Connection c;
    c.token = 0x1234;
    // f: 20 ms, window full; s: 50 ms. Little unsent data: f finishes it sooner -> wait for f.
    c.subflows = {sf(1, 20000, 1000, 100000, 100000), sf(2, 50000, 2000, 10000, 5000)};
    c.unsent = 10000;
    be.conns = {c};
    REQUIRE(s.on_tick());
    CHECK(be.writes == W{hold});
    // Lots of unsent data: both paths are needed -> s used.
    be.conns[0].unsent = 50'000'000;
    REQUIRE(s.on_tick());
    CHECK(be.writes == W{hold, use});
    // f has room (ECF sends on f alone): held back after hold_ticks ticks in a row.
    be.conns[0].subflows[0].inflight = 10000;
    REQUIRE(s.on_tick());
    REQUIRE(s.on_tick());
    CHECK(be.writes == W{hold, use});
    REQUIRE(s.on_tick());
    CHECK(be.writes == W{hold, use, hold});
    // The held subflow's srtt (stale: no samples while held) now looks the fastest: released;
    // while it carries nothing the decision stands.
    be.conns[0].subflows[1].srtt_us = 15000;
    REQUIRE(s.on_tick());
    CHECK(be.writes == W{hold, use, hold, use});
    be.conns[0].subflows[1].inflight = 0;
    for (int i = 0; i < 9; i++) REQUIRE(s.on_tick());
    CHECK(be.writes.size() == 4);
    // The flag is written again every resignal_ticks (a subflow gone quiet since gets it).
    REQUIRE(s.on_tick());
    CHECK(be.writes == W{hold, use, hold, use, use});
    // A single subflow has nothing to wait for, nothing is written.
    be.conns[0].subflows.pop_back();
    for (int i = 0; i < 12; i++) REQUIRE(s.on_tick());
    CHECK(be.writes.size() == 5);
    CHECK(s.status().failures == 0);
    // A host whose connections never wait (here: a receiver, nothing in flight) never writes.
    FakeBackend rx;
    Script r(spec(file("lua/ecf.lua"), {{"hold_ticks", 3}, {"resignal_ticks", 10}}, 20), rx);
    rx.conns = {c};
    rx.conns[0].subflows[0].inflight = 0;
    rx.conns[0].subflows[1].inflight = 0;
    for (int i = 0; i < 25; i++) REQUIRE(r.on_tick());
    CHECK(rx.writes.empty());
}

// path_resilience.lua: a client whose paths are its `subflow` endpoints on c1 and c2.
struct ResilienceHost {
    FakeBackend be;
    Script script;
    explicit ResilienceHost(uint32_t probe_ms = 1000)
        : script(spec(file("lua/path_resilience.lua"),
                      {{"stall_ms", 1000}, {"probe_every_ms", probe_ms}}, 200),
                 be) {
        be.eps = {{1, "10.0.1.1", "c1", true, false, false},
                  {2, "10.0.2.1", "c2", true, false, false},
                  {3, "10.0.3.1", "c3", false, true, false}};  // signal only: not a path
    }
    // One connection: a subflow per address, each quiet for `quiet_ms` (data and ACKs) and
    // having received `received` bytes.
    void connection(std::vector<std::tuple<std::string, uint32_t, uint64_t>> subflows) {
        Connection c;
        c.token = 9;
        uint64_t id = 1;
        for (const auto& [address, quiet_ms, received] : subflows) {
            Subflow s = sf(id++, 20000, 1000, 14480, 0);
            s.local_address = address;
            s.last_recv_ms = s.last_ack_ms = quiet_ms;
            s.bytes_received = received;
            c.subflows.push_back(s);
        }
        be.conns = {c};
    }
};

TEST_CASE("lua: path_resilience renews a path's endpoint when its link comes back",
          "[lua][scripts]") {
    ResilienceHost h;
    REQUIRE(h.script.status().loaded);
    CHECK(h.script.on_link({"c1", true}));  // up without having been down: nothing to do
    CHECK(h.script.on_link({"c1", false}));
    // Its subflow has not noticed yet (heard from the peer 5 ms ago): still down, not probed.
    h.connection({{"10.0.1.1", 5, 1000}, {"10.0.2.1", 5, 1000}});
    CHECK(h.script.on_tick());
    CHECK(h.be.renewed.empty());
    CHECK(h.script.status().published == nlohmann::json{{"10.0.1.1", "down"}, {"renewals", 0}});
    CHECK(h.script.on_link({"c9", true}));  // no endpoint there
    CHECK(h.script.on_link({"c1", true}));
    CHECK(h.be.renewed == std::vector<std::string>{"10.0.1.1"});
    // The renewed subflow hears from the peer: the path is back, no more probes.
    h.connection({{"10.0.1.1", 5, 0}, {"10.0.2.1", 5, 1000000}});
    CHECK(h.script.on_tick());
    CHECK(h.script.on_link({"c1", true}));
    CHECK(h.be.renewed.size() == 1);
    INFO(h.script.status().last_error);
    CHECK(h.script.status().failures == 0);
}

TEST_CASE("lua: path_resilience probes a blackholed path until a subflow over it is back",
          "[lua][scripts]") {
    ResilienceHost h(50);
    // Path 1 carried data and has heard nothing for 1.5 s; path 2 hears from the peer.
    h.connection({{"10.0.1.1", 1500, 500000}, {"10.0.2.1", 10, 800000}});
    CHECK(h.script.on_tick());
    CHECK(h.be.renewed == std::vector<std::string>{"10.0.1.1"});
    CHECK(h.script.on_tick());  // within probe_every_ms: no second SYN yet
    CHECK(h.be.renewed.size() == 1);
    CHECK(h.script.status().published == nlohmann::json{{"10.0.1.1", "probing"}, {"renewals", 1}});
    std::this_thread::sleep_for(60ms);
    h.connection({{"10.0.2.1", 10, 900000}});  // the renewal closed the old subflow
    CHECK(h.script.on_tick());
    CHECK(h.be.renewed.size() == 2);
    // The new subflow over path 1 is established: no more probes.
    h.connection({{"10.0.1.1", 3, 0}, {"10.0.2.1", 10, 900000}});
    std::this_thread::sleep_for(60ms);
    CHECK(h.script.on_tick());
    std::this_thread::sleep_for(60ms);
    CHECK(h.script.on_tick());
    CHECK(h.be.renewed.size() == 2);
    CHECK(h.script.status().published == nlohmann::json{{"renewals", 2}});
    INFO(h.script.status().last_error);
    CHECK(h.script.status().failures == 0);
}

TEST_CASE("lua: path_resilience leaves idle paths, idle connections and other addresses alone",
          "[lua][scripts]") {
    ResilienceHost h(0);
    // Path 1 never carried data (the peer's scheduler uses path 2 only): idle, not stalled.
    h.connection({{"10.0.1.1", 5000, 0}, {"10.0.2.1", 10, 800000}});
    CHECK(h.script.on_tick());
    // The whole connection is quiet (nothing to send): no path is suspect.
    h.connection({{"10.0.1.1", 5000, 500000}, {"10.0.2.1", 5000, 800000}});
    CHECK(h.script.on_tick());
    // A stalled subflow on an address that is not a subflow endpoint: nothing to renew.
    h.connection({{"10.0.3.1", 5000, 500000}, {"10.0.2.1", 10, 800000}});
    CHECK(h.script.on_tick());
    CHECK(h.be.renewed.empty());
    INFO(h.script.status().last_error);
    CHECK(h.script.status().failures == 0);
}

// ---- the API -------------------------------------------------------------------------------

TEST_CASE("lua: set_status publishes a small flat table, escaped; bad input changes nothing",
          "[lua][api]") {
    FakeBackend be;
    Script s(spec(R"(
        function on_tick()
          mpsteer.set_status({path = "probing\n\27[31mred", n = 3, ok = true, r = 0.5,
                              long = string.rep("x", 1000)})
          for _, bad in ipairs({{[1] = "x"}, {t = {}}, {f = print}, {[string.rep("k", 65)] = 1}}) do
            assert(not pcall(mpsteer.set_status, bad))
          end
          local many = {}
          for i = 1, 33 do many["k" .. i] = i end
          assert(not pcall(mpsteer.set_status, many))
          assert(not pcall(mpsteer.set_status, "text"))
        end
    )",
                  {}, 10),
             be);
    REQUIRE(s.on_tick());
    const auto& p = s.status().published;
    CHECK(p.size() == 5);
    CHECK(p["path"] == "probing\\n\\x1b[31mred");
    CHECK(p["n"] == 3);
    CHECK(p["ok"] == true);
    CHECK(p["r"] == 0.5);
    CHECK(p["long"].get<std::string>().size() < 300);
    CHECK(s.status().to_json()["published"] == p);
}

TEST_CASE("lua: events reach their hooks with the documented fields", "[lua][api]") {
    FakeBackend be;
    Connection c;
    c.token = 42;
    c.subflows = {sf(7, 1000, 10, 14480, 0)};
    c.subflows[0].local_address = "10.0.1.1";
    c.subflows[0].bytes_received = 5;
    c.subflows[0].last_recv_ms = 6;
    c.subflows[0].last_ack_ms = 7;
    be.conns = {c};
    be.eps = {{4, "10.0.2.1", "c2", true, false, true}};
    Script s(spec(R"(
        seen = {}
        function on_connection(c) seen[#seen+1] = "conn " .. c.token .. " " .. #c.subflows end
        function on_subflow(sf) seen[#seen+1] = "sf " .. sf.id .. " " .. sf.srtt_us .. " " .. tostring(sf.local_socket) end
        function on_subflow_closed(sf) seen[#seen+1] = "closed " .. sf.id end
        function on_add_addr_blocked(a) seen[#seen+1] = "blocked " .. a.address .. " " .. a.addr_id end
        function on_apply(i) seen[#seen+1] = "apply " .. i.revision .. " " .. tostring(i.reloaded) end
        function on_link(l) assert(l.interface == "c1" and l.up == false); links = (links or 0) + 1 end
        function on_tick(every) seen[#seen+1] = "tick " .. every
          local e = mpsteer.endpoints()
          assert(#e == 1 and e[1].id == 4 and e[1].address == "10.0.2.1" and e[1].interface == "c2")
          assert(e[1].subflow == true and e[1].signal == false and e[1].backup == true)
          assert(mpsteer.renew_endpoint("10.0.2.1") == true)
          assert(mpsteer.renew_endpoint("10.0.9.1") == false)
          assert(not pcall(mpsteer.renew_endpoint, string.rep("1", 65)))
          assert(not pcall(mpsteer.renew_endpoint, {}))
          local f = mpsteer.subflow(7)
          assert(f.local_address == "10.0.1.1" and f.bytes_received == 5 and f.last_recv_ms == 6)
          assert(f.last_ack_ms == 7 and links == 1)
          local cs = mpsteer.connections()
          assert(#cs == 1 and cs[1].subflows[1].id == 7 and cs[1].subflows[1].cwnd == 14480)
          assert(mpsteer.connection(42).token == 42 and mpsteer.connection(43) == nil)
          assert(mpsteer.subflow(7).local_socket == true)
          assert(mpsteer.set_rate(7, 1000) == true and mpsteer.set_rate(8, 1) == false)
          assert(mpsteer.set_subflow(7, {backup = true}) == true)
          assert(mpsteer.add_subflow(42, 1) and mpsteer.block_address(42, 2))
          assert(mpsteer.set_policy_backup(true) == 1)
          assert(mpsteer.rate("8Mbit") == 1000000)
          assert(params.n == 3 and params.list[2] == "b" and mpsteer.policy == "p")
        end
    )",
                  {{"n", 3}, {"list", {"a", "b"}}}, 10),
             be);
    REQUIRE(s.status().loaded);
    CHECK(s.on_connection(c));
    CHECK(s.on_subflow(c.subflows[0]));
    CHECK(s.on_subflow_closed(c.subflows[0]));
    AddAddr a;
    a.address = "10.0.2.2";
    a.addr_id = 1;
    CHECK(s.on_add_addr_blocked(a));
    CHECK(s.on_link({"c1", false}));
    CHECK(s.on_apply({{"revision", "abc"}, {"generation", 3}, {"reloaded", true}}));
    CHECK(s.on_tick());
    INFO(s.status().last_error);
    CHECK(s.status().failures == 0);
    CHECK(be.writes == std::vector<Write>{{"rate", 7, 1000},
                                          {"backup", 7, 1},
                                          {"add", 42, 1},
                                          {"block", 42, 2},
                                          {"policy_backup", 0, 1}});
    CHECK(be.renewed == std::vector<std::string>{"10.0.2.1"});
    CHECK(s.status().writes == 6);
}

TEST_CASE("lua: a hook's returned table sets its subflow; unknown keys are errors", "[lua][api]") {
    FakeBackend be;
    Connection c;
    c.token = 1;
    c.subflows = {sf(5, 1000, 10, 0, 0)};
    be.conns = {c};
    Script s(spec(R"(
        mode = "ok"
        function on_subflow(sf)
          if mode == "ok" then return {rate = 2500000, backup = false} end
          if mode == "typo" then return {rat = 1} end
          if mode == "string" then return "fast" end
          if mode == "badrate" then return {rate = "fast"} end
          if mode == "api" then mpsteer.set_subflow(sf.id, {rate = 1, colour = "red"}) end
        end
        function on_tick() return 1 end
    )"),
             be, small_limits());
    REQUIRE(s.on_subflow(c.subflows[0]));
    CHECK(be.writes == std::vector<Write>{{"rate", 5, 2500000}, {"backup", 5, 0}});
    auto fails_with = [&](const char* mode, const std::string& text) {
        Script probe(
            spec(
                std::string("mode = '") + mode + "'\n" +
                "function on_subflow(sf)\n"
                "  if mode == 'typo' then return {rat = 1} end\n"
                "  if mode == 'string' then return 'fast' end\n"
                "  if mode == 'badrate' then return {rate = 'fast'} end\n"
                "  if mode == 'api' then mpsteer.set_subflow(sf.id, {rate = 1, colour = 'red'}) end\n"
                "  if mode == 'log' then mpsteer.log('loud', 'x') end\n"
                "end\n"),
            be, small_limits());
        CHECK_FALSE(probe.on_subflow(c.subflows[0]));
        INFO(probe.status().last_error);
        CHECK(probe.status().last_error.find(text) != std::string::npos);
    };
    fails_with("typo", "unknown key 'rat'");
    fails_with("string", "must return nothing or a table");
    fails_with("badrate", "rate must be a non-negative number");
    fails_with("api", "unknown key 'colour'");
    fails_with("log", "unknown level 'loud'");
    CHECK_FALSE(s.on_tick());
    CHECK(s.status().last_error.find("on_tick must return nothing (got a number)") !=
          std::string::npos);
}

// ---- the sandbox ---------------------------------------------------------------------------

TEST_CASE("lua: the unsafe libraries and functions are absent", "[lua][sandbox]") {
    FakeBackend be;
    for (const char* expr :
         {"io", "os", "package", "debug", "require", "dofile", "loadfile", "collectgarbage",
          "string.dump", "coroutine", "(\"\").dump", "getmetatable(\"\").__index.dump"}) {
        Script s(spec(std::string("assert(") + expr + " == nil, '" + expr + " is reachable')"), be);
        INFO(expr << ": " << s.status().last_error);
        CHECK(s.status().loaded);
    }
    // Using them is a runtime error, contained and reported.
    Script s(spec("function on_tick() return os.execute('touch /tmp/mpsteer-lua-pwned') end"), be,
             small_limits());
    CHECK_FALSE(s.on_tick());
    CHECK(s.status().last_error.find("attempt to index a nil value (global 'os')") !=
          std::string::npos);
    CHECK_FALSE(std::filesystem::exists("/tmp/mpsteer-lua-pwned"));
}

TEST_CASE("lua: bytecode is refused, by the loader and by load()", "[lua][sandbox]") {
    FakeBackend be;
    // A precompiled chunk as the script itself.
    Script bin(spec(std::string("\x1bLua\x54\x00", 6) + "junk"), be);
    CHECK(bin.disabled());
    CHECK(bin.status().last_error.find("attempt to load a binary chunk") != std::string::npos);
    Script s(spec(R"(
        local f, err = load("\27Lua\84\0junk")
        assert(f == nil and err:find("binary chunk"), tostring(err))
        local ok, e2 = pcall(load, "return 1", "x", "b")
        assert(not ok and e2:find("not allowed"), tostring(e2))
        local ok3, e3 = pcall(load, function() return nil end)
        assert(not ok3 and e3:find("must be a string"), tostring(e3))
        -- text chunks work, with an environment that has none of the globals
        assert(load("return 1 + 1")() == 2)
        local g = load("return print", "x", "t", {})
        assert(g() == nil)
    )"),
             be);
    INFO(s.status().last_error);
    CHECK(s.status().loaded);
}

TEST_CASE("lua: an infinite loop hits the budget, even under pcall; the script is disabled",
          "[lua][sandbox]") {
    FakeBackend be;
    Script s(spec(R"(
        function on_tick() while true do end end
        function on_subflow() while true do pcall(function() while true do end end) end end
    )"),
             be, small_limits());
    auto t0 = Clock::now();
    CHECK_FALSE(s.on_subflow(Subflow{}));
    CHECK(s.status().last_error.find("instruction budget exceeded") != std::string::npos);
    CHECK_FALSE(s.on_tick());
    CHECK_FALSE(s.disabled());
    CHECK_FALSE(s.on_tick());
    CHECK(s.disabled());  // three in a row
    CHECK(Clock::now() - t0 < 2s);
    CHECK_FALSE(s.on_tick());  // disabled: not called
    CHECK(s.status().calls == 3);
    auto j = s.status().to_json();
    CHECK(j["state"] == "disabled");
    CHECK(j["failures"] == 3);
}

TEST_CASE("lua: a memory bomb hits the cap and is contained", "[lua][sandbox]") {
    FakeBackend be;
    Script s(spec(R"(
        function on_tick()
          local t = {}
          for i = 1, 1e9 do t[i] = string.rep("x", 1024) .. i end
        end
        function on_subflow() local ok = pcall(function() local t = {} for i = 1, 1e9 do t[i] = i end end) end
        function on_subflow_closed() return #string.rep("x", 1 << 40) end
        function on_connection() return #string.rep("", 1e18) end
    )"),
             // The time budget far off: under emulation on a busy machine filling 4 MB took
             // over the default second, and the clock, not the cap, stopped the script.
             be, Limits{50'000'000, 4u << 20, 3, std::chrono::seconds(30)});
    CHECK_FALSE(s.on_tick());
    INFO(s.status().last_error);
    CHECK(s.status().last_error.find("memory cap exceeded") != std::string::npos);
    CHECK_FALSE(s.on_subflow(Subflow{}));  // pcall does not swallow the cap
    CHECK(s.status().last_error.find("memory cap exceeded") != std::string::npos);
    CHECK_FALSE(s.on_subflow_closed(Subflow{}));  // refused before allocating
    CHECK(s.status().last_error.find("string.rep: result beyond the memory cap") !=
          std::string::npos);
    auto t0 = Clock::now();
    CHECK_FALSE(s.on_connection(Connection{}));  // returns a number: wrong return type, but quick
    CHECK(Clock::now() - t0 < 1s);
}

TEST_CASE("lua: runtime errors come with a traceback; success resets the failure count",
          "[lua][sandbox]") {
    FakeBackend be;
    Script s(spec("n = 0\n"
                  "local function inner(x) return x.field end\n"
                  "function on_tick() n = n + 1; if n % 2 == 1 then return inner(nil) end end\n"),
             be, small_limits());
    CHECK_FALSE(s.on_tick());
    const auto& e = s.status().last_error;
    INFO(e);
    CHECK(e.find("test.lua:2: attempt to index a nil value") != std::string::npos);
    CHECK(e.find("stack traceback") != std::string::npos);
    CHECK(s.on_tick());
    CHECK(s.status().consecutive_failures == 0);
    CHECK_FALSE(s.on_tick());
    CHECK(s.on_tick());
    CHECK_FALSE(s.disabled());
    CHECK(s.status().failures == 2);
}

TEST_CASE("lua: a script that fails to load is disabled at once", "[lua][sandbox]") {
    FakeBackend be;
    Script syntax(spec("function on_tick( end"), be);
    CHECK(syntax.disabled());
    CHECK(syntax.status().last_error.find("load:") == 0);
    Script boom(spec("error('no')"), be);
    CHECK(boom.disabled());
    Script loop(spec("while true do end"), be, small_limits());
    CHECK(loop.disabled());
    CHECK(loop.status().last_error.find("instruction budget") != std::string::npos);
}

TEST_CASE("lua: a backend exception is a Lua error in the calling script only", "[lua][api]") {
    struct Throwing : FakeBackend {
        std::vector<Connection> connections() override { throw std::runtime_error("map gone"); }
    } be;
    HookSet set(be, small_limits());
    set.configure({spec("function on_tick() mpsteer.connections() end", {}, 10, "a"),
                   spec("n = 0; function on_tick() n = n + 1 end", {}, 10, "b")},
                  "r1", 1);
    auto now = Clock::now() + 20ms;
    for (int i = 0; i < 5; ++i) now = set.tick(now);
    auto st = set.status();
    REQUIRE(st.size() == 2);
    CHECK(st[0].disabled);
    CHECK(st[0].last_error.find("map gone") != std::string::npos);
    CHECK_FALSE(st[1].disabled);
    CHECK(st[1].calls == 5);  // ticks (a missing on_apply is not a call)
}

// ---- the set -------------------------------------------------------------------------------

TEST_CASE("lua: configure keeps unchanged scripts, reloads changed ones, drops removed ones",
          "[lua][set]") {
    FakeBackend be;
    HookSet set(be);
    const std::string counter =
        "n = 0; applied = {}\n"
        "function on_tick() n = n + 1 end\n"
        "function on_apply(i) applied[#applied+1] = i.reloaded\n"
        "  if i.revision == 'r3' then assert(n == 2 and #applied == 3 and applied[1] == true"
        " and applied[2] == false and applied[3] == false) end end\n";
    auto loaded =
        set.configure({spec(counter, {}, 100, "a"), spec(counter, {}, 100, "b")}, "r1", 1);
    CHECK(loaded.size() == 2);
    auto t = Clock::now() + 150ms;
    set.tick(t);
    t += 100ms;
    set.tick(t);
    // r2: a unchanged, b's params changed -> b reloaded (fresh state).
    loaded =
        set.configure({spec(counter, {}, 100, "a"), spec(counter, {{"x", 1}}, 100, "b")}, "r2", 2);
    CHECK(loaded == std::vector<std::string>{"b"});
    // r3: on_apply asserts the kept state of a (two ticks, applied twice: true then false).
    set.configure({spec(counter, {}, 100, "a")}, "r3", 3);
    REQUIRE(set.size() == 1);
    INFO(set.status()[0].last_error);
    CHECK(set.status()[0].failures == 0);
}

TEST_CASE("lua: ticks follow each script's interval", "[lua][set]") {
    FakeBackend be;
    HookSet set(be);
    set.configure({spec("n = 0; function on_tick() n = n + 1 end", {}, 10, "fast"),
                   spec("n = 0; function on_tick() n = n + 1 end", {}, 100, "slow")},
                  "r", 1);
    auto start = Clock::now();
    for (int ms = 1; ms <= 1000; ++ms) set.tick(start + std::chrono::milliseconds(ms));
    auto st = set.status();
    CHECK(st[0].calls >= 99);
    CHECK(st[0].calls <= 101);
    CHECK(st[1].calls >= 9);
    CHECK(st[1].calls <= 11);
}

TEST_CASE("lua: idle_every slows ticks while there is no connection; one brings them back at once",
          "[lua][set]") {
    FakeBackend be;
    be.none = true;
    HookSet set(be);
    auto s = spec("n = 0; function on_tick() n = n + 1 end", {}, 10, "ecf");
    s.idle_every_ms = 100;
    set.configure({s, spec("n = 0; function on_tick() n = n + 1 end", {}, 10, "plain")}, "r", 1);
    auto start = Clock::now();
    auto at = [&](int ms) { return start + std::chrono::milliseconds(ms); };
    for (int ms = 1; ms <= 1000; ++ms) set.tick(at(ms));
    CHECK(set.status()[0].calls >= 9);  // idle: every 100 ms
    CHECK(set.status()[0].calls <= 12);
    CHECK(set.status()[1].calls >= 99);  // no idle_every: every 10 ms regardless
    const uint64_t idle_calls = set.status()[0].calls;

    // Events while still idle change nothing; the first connection makes the tick due now.
    CHECK(set.wake(at(1001)) > at(1001));
    be.none = false;
    CHECK(set.wake(at(1002)) == at(1002));
    set.tick(at(1002));
    CHECK(set.status()[0].calls == idle_calls + 1);
    for (int ms = 1003; ms <= 2002; ++ms) set.tick(at(ms));
    CHECK(set.status()[0].calls >= idle_calls + 99);  // every 10 ms again
}

// ---- telemetry: TCP_INFO by sock_diag, matched to flow keys --------------------------------

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lua/datapath_backend.h"

TEST_CASE("lua: sock_diag finds a local TCP connection under its flow key, either order",
          "[lua][telemetry]") {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    REQUIRE(listen(ls, 1) == 0);
    socklen_t len = sizeof sa;
    getsockname(ls, reinterpret_cast<sockaddr*>(&sa), &len);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    int a = accept(ls, nullptr, nullptr);
    REQUIRE(a >= 0);
    char buf[4096] = {};
    REQUIRE(send(c, buf, sizeof buf, 0) == sizeof buf);
    REQUIRE(recv(a, buf, sizeof buf, MSG_WAITALL) == sizeof buf);
    sockaddr_in local{};
    len = sizeof local;
    getsockname(c, reinterpret_cast<sockaddr*>(&local), &len);

    mps_flow_key k{};
    k.family = 4;
    k.a[0] = local.sin_addr.s_addr;
    k.port_a = ntohs(local.sin_port);
    k.b[0] = sa.sin_addr.s_addr;
    k.port_b = ntohs(sa.sin_port);
    mps_flow_key swapped{};
    swapped.family = 4;
    swapped.a[0] = k.b[0];
    swapped.port_a = k.port_b;
    swapped.b[0] = k.a[0];
    swapped.port_b = k.port_a;
    CHECK(canonical_pair(k) == canonical_pair(swapped));

    auto socks = tcp_sockets();
    auto it = socks.find(canonical_pair(k));
    REQUIRE(it != socks.end());  // one of the two sockets (both ends share the pair)
    CHECK(it->second.srtt_us > 0);
    CHECK(it->second.cwnd_bytes > 0);
    CHECK(it->second.bytes_acked + it->second.bytes_received >= sizeof buf);
    close(a);
    close(c);
    close(ls);
}

TEST_CASE("lua: calls leave their garbage; collect_step collects it between events", "[lua][gc]") {
    FakeBackend b;
    HookSet set(b);
    set.configure({{"p", "gc.lua",
                    "function on_tick()\n"
                    "  local t = {}\n"
                    "  for i = 1, 2000 do t[i] = {i, tostring(i)} end\n"
                    "end\n",
                    10, nlohmann::json::object()}},
                  "r", 1);
    Script* s = set.find("p");
    REQUIRE(s);
    while (set.collect_step()) {}
    const size_t base = s->memory_bytes();
    for (int i = 0; i < 5; ++i) CHECK(s->on_tick());
    const size_t peak = s->memory_bytes();
    CHECK(peak > base + (200u << 10));  // no collection inside the calls (beyond Lua's own)
    while (set.collect_step()) {}
    CHECK(s->memory_bytes() < base + (100u << 10));
    CHECK_FALSE(set.collect_step());  // nothing grew since: no work
    CHECK(set.calls() == 5);
}

TEST_CASE("lua: event latency histogram percentiles", "[lua][events]") {
    LatencyHistogram h;
    CHECK(h.percentile_us(99) == 0);
    for (uint64_t us = 1; us <= 1000; ++us) h.add(us * 1000);
    CHECK(h.count() == 1000);
    CHECK(h.percentile_us(50) == Approx(500).epsilon(0.07));
    CHECK(h.percentile_us(99) == Approx(990).epsilon(0.07));
    CHECK(h.percentile_us(100) == Approx(1000));
    CHECK(h.max_us() == Approx(1000));
    CHECK(h.sum_us() == Approx(500500));
    LatencyHistogram small;
    for (uint64_t ns : {0u, 1u, 31u, 32u, 33u}) small.add(ns);
    CHECK(small.percentile_us(20) == Approx(0));
    CHECK(small.percentile_us(100) == Approx(0.033));
    small.add(uint64_t(1) << 62);  // far beyond any bucket: the last one
    CHECK(small.max_us() > 1e12);
}

TEST_CASE("lua: --events modes by name", "[lua][events]") {
    for (auto m : {PollMode::wait, PollMode::spin, PollMode::adaptive})
        CHECK(poll_mode_from_string(to_string(m)) == m);
    CHECK_FALSE(poll_mode_from_string("busy"));
}

// ---- what calls the scripts, under a connection flood ----------------------------------------

#include "lua/hook_dispatcher.h"

namespace {
mps_flow_key flow_of(uint32_t n) {
    mps_flow_key k{};
    k.family = 4;
    k.a[0] = htonl(0x0a000001);
    k.b[0] = htonl(0x0a000002 + (n >> 16));
    k.port_a = uint16_t(n);
    k.port_b = 80;
    return k;
}
mpsteer::datapath::Event event_of(uint8_t type, uint32_t n, uint32_t token) {
    mpsteer::datapath::Event ev;
    ev.raw.type = type;
    ev.raw.flow = flow_of(n);
    ev.token_a = token;
    ev.token_b = token + 1;
    ev.have_flow = true;
    ev.flow.conn_token = token;
    return ev;
}
}  // namespace

TEST_CASE("lua: flow ids are bounded; the oldest goes first", "[lua][set]") {
    FlowIds ids(3);
    const uint64_t a = ids.id_of(flow_of(1)), b = ids.id_of(flow_of(2)), c = ids.id_of(flow_of(3));
    CHECK(ids.id_of(flow_of(1)) == a);  // stable while it lives
    const uint64_t d = ids.id_of(flow_of(4));
    CHECK(ids.size() == 3);
    CHECK_FALSE(ids.key_of(a));
    CHECK(ids.key_of(b));
    CHECK(ids.key_of(c));
    CHECK(ids.key_of(d));
    CHECK(ids.oldest() == b);
    CHECK(ids.id_of(flow_of(1)) > d);  // came back: a new id
    ids.forget(flow_of(3));
    CHECK_FALSE(ids.key_of(c));
}

TEST_CASE("lua: connections that never close cannot grow the agent; each is announced once",
          "[lua][set]") {
    FakeBackend be;
    HookSet set(be);
    set.configure({spec("function on_connection(c) end\n"
                        "function on_subflow_closed(sf) end\n",
                        {}, 0, "count")},
                  "r1", 1);
    const size_t cap = 1000;
    FlowIds ids(cap);
    HookDispatcher dispatcher(ids);
    // 100 times the table: a remote host opening connections and never closing them
    for (uint32_t i = 0; i < 100 * cap; i++) {
        dispatcher.dispatch(set, event_of(MPS_EV_MP_CAPABLE, i, 1000 + i));
        dispatcher.dispatch(set, event_of(MPS_EV_MP_CAPABLE, i, 1000 + i));  // the keys again
    }
    CHECK(ids.size() == cap);
    CHECK(dispatcher.connections_tracked() <= cap);
    // closes of the live ones free their places; an unknown close costs nothing kept
    for (uint32_t i = 100 * cap - 10; i < 100 * cap; i++)
        dispatcher.dispatch(set, event_of(MPS_EV_FLOW_CLOSED, i, 0));
    dispatcher.dispatch(set, event_of(MPS_EV_FLOW_CLOSED, 7, 0));
    CHECK(ids.size() == cap - 10);
    CHECK(dispatcher.connections_tracked() == cap - 10);
    auto st = set.status();
    REQUIRE(st.size() == 1);
    CHECK(st[0].calls == 100 * cap + 11);  // each connection once, every close
    CHECK(st[0].failures == 0);
}
