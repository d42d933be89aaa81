// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent as a process the way systemd runs it: SIGTERM with the metrics server on stops it
// cleanly (exit 0, the final status and --detach-on-exit done), SIGHUP re-reads the policy
// directory, a second agent on the same pin root is refused, and the runtime files get their
// modes and never follow a link planted beside them; only the hooks and interfaces policies
// name carry a program, whatever the revision before.
#include <catch2/catch.hpp>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>

#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "agent_harness.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

uint64_t applies_failed(const json& s) {
    return s.contains("applies") ? s["applies"].value("failed", uint64_t(0)) : 0;
}

// One policy: `record` on the hooks and interfaces given.
std::string record_policy(const std::string& hooks, const std::string& interfaces) {
    return "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata:\n  name: counted\nspec:\n"
           "  attach: {hooks: [" +
           hooks + "], interfaces: [" + interfaces +
           "]}\n"
           "  priority: 100\n  select:\n    - port: {either: 5201}\n"
           "  actions:\n    - record: {}\n";
}

// The hooks of an interface that hold a BPF program, as the kernel reports them (XDP in any
// mode, TCX ingress and egress, a clsact filter), e.g. "xdp tc_ingress".
std::string programs_on(const std::string& netns, const std::string& ifname) {
    std::string out;
    {
        NetnsGuard in(netns);
        if (if_nametoindex(ifname.c_str()) == 0)
            throw Error("no interface " + ifname + " in " + netns);
        for (auto hook :
             {datapath::Hook::xdp, datapath::Hook::tc_ingress, datapath::Hook::tc_egress})
            if (!datapath::attached_programs(ifname, hook).empty())
                out += std::string(" ") + std::string(to_string(hook));
    }
    const std::string tc = must_in(netns, {"tc", "filter", "show", "dev", ifname, "ingress"}) +
                           must_in(netns, {"tc", "filter", "show", "dev", ifname, "egress"});
    if (tc.find("bpf") != std::string::npos) out += " clsact";
    return out.empty() ? "" : out.substr(1);
}

}  // namespace

TEST_CASE("agent process: only the hooks and interfaces a policy names get a program", "[agent]") {
    Lab lab(lab_config("only"));
    AgentHarness h(lab, "only");
    const std::string s1 = lab.server_if(1), s2 = lab.server_if(2), ns = lab.server_ns();
    auto state = [&] {
        return "s1[" + programs_on(ns, s1) + "] s2[" + programs_on(ns, s2) + "] lo[" +
               programs_on(ns, "lo") + "]";
    };
    auto applied = [&](const std::string& id) {
        return h.wait_status(
            [&](const json& s) {
                return s.value("ready", false) && s.value("applied_revision", "") == id;
            },
            60s);
    };
    auto rev = h.publish({{"policies/p.yaml", record_policy("tc_ingress", s2)}});
    h.start();
    INFO("agent log:\n" << h.log_tail());
    REQUIRE(applied(rev));
    CHECK(state() == "s1[] s2[tc_ingress] lo[]");
    // Moved: the old hook's program goes, the new one comes, nothing else.
    rev = h.publish({{"policies/p.yaml", record_policy("xdp, tc_egress", s1)}});
    REQUIRE(applied(rev));
    CHECK(state() == "s1[xdp tc_egress] s2[] lo[]");
    // No policy at all: no program anywhere.
    rev = h.publish({{"README.md", "nothing enforced\n"}});
    REQUIRE(applied(rev));
    CHECK(state() == "s1[] s2[] lo[]");
    CHECK(h.status()["attachments"].empty());
}

TEST_CASE(
    "agent process: a restarted agent takes over the clsact filters the last one left running "
    "(kernels without TCX)",
    "[agent]") {
    Lab lab(lab_config("cls"));
    AgentHarness h(lab, "clsact");
    const std::string ns = lab.server_ns(), s1 = lab.server_if(1);
    setenv("MPSTEER_TC_WITHOUT_TCX", "1", 1);
    struct Unset {
        ~Unset() { unsetenv("MPSTEER_TC_WITHOUT_TCX"); }
    } unset;
    auto filters = [&](const char* dir) {
        const std::string out = must_in(ns, {"tc", "filter", "show", "dev", s1, dir});
        size_t n = 0;
        for (size_t at = out.find(" handle "); at != std::string::npos;
             at = out.find(" handle ", at + 1))
            ++n;
        return n;
    };
    const auto rev = h.publish({{"policies/p.yaml", record_policy("tc_ingress, tc_egress", s1)}});
    auto applied = [&] {
        return h.wait_status(
            [&](const json& s) {
                return s.value("ready", false) && s.value("applied_revision", "") == rev;
            },
            60s);
    };
    h.start();
    INFO("agent log:\n" << h.log_tail());
    REQUIRE(applied());
    CHECK(h.status()["attachments"][0].value("mode", "") == "tc-filter");
    REQUIRE(h.stop() == 0);
    // Its datapath stays attached after it exits; the next agent takes the filters over.
    CHECK(filters("ingress") == 1);
    CHECK(filters("egress") == 1);
    h.start();
    CHECK(applied());
    CHECK(filters("ingress") == 1);
    CHECK(filters("egress") == 1);
    CHECK(h.stop() == 0);
}

TEST_CASE("agent process: SIGTERM with the metrics server on stops cleanly", "[agent][signals]") {
    Lab lab(lab_config("sig"));
    AgentHarness h(lab, "sigterm");
    h.metrics_port = 19477;
    h.extra_args = {"--detach-on-exit", "--flows", "4096"};
    PolicyGen gen(lab, 1);
    h.publish(gen.valid(1).files);
    // This agent runs the datapath built without kernel BTF, and says so.
    setenv("MPSTEER_DATAPATH_WITHOUT_BTF", "1", 1);
    const pid_t pid = h.start();
    unsetenv("MPSTEER_DATAPATH_WITHOUT_BTF");
    REQUIRE(h.wait_status([](const json& s) { return s.value("ready", false); }, 120s));
    CHECK(h.status().value("datapath_without_btf", "") == "MPSTEER_DATAPATH_WITHOUT_BTF is set");
    auto text = run({mpsteer_bin(), "status", "--state-dir", h.state_dir()});
    INFO(text.out);
    CHECK(text.out.find("datapath:   built without kernel BTF (MPSTEER_DATAPATH_WITHOUT_BTF is "
                        "set)") != std::string::npos);
    // The metrics endpoint answers inside the agent's namespace.
    auto m = run_in(lab.server_ns(), {"curl", "-sf", "http://127.0.0.1:19477/metrics"});
    INFO(m.out);
    CHECK(m.out.find("mpsteer_ready 1") != std::string::npos);
    // The state tables have the size asked for, and say what they take.
    CHECK(m.out.find("mpsteer_table_capacity{table=\"flows\"} 4096\n") != std::string::npos);
    CHECK(m.out.find("mpsteer_table_capacity{table=\"conns\"} 1024\n") != std::string::npos);
    const json tables = h.status()["tables"];
    INFO(tables.dump());
    CHECK(tables["flows"].value("capacity", 0) == 4096);
    CHECK(tables["flows"].value("memory_bytes", uint64_t(0)) > 4096u * 200);
    // Counted: entries (at most the capacity) and evictions (none in an idle lab).
    CHECK(tables["flows"].value("entries", uint64_t(99999)) <= 4096u);
    CHECK(tables["flows"].value("evictions", uint64_t(99999)) == 0u);
    CHECK(m.out.find("mpsteer_table_evictions_total{table=\"flows\"} 0\n") != std::string::npos);

    const int64_t signalled = unix_ms_now();
    const int st = h.stop();
    INFO("agent log:\n" << h.log_tail());
    REQUIRE(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    const json s = h.status();
    REQUIRE(s.is_object());
    CHECK(s.value("pid", 0) == pid);
    CHECK(s.value("updated_unix_ms", int64_t(0)) >= signalled);  // the final write
    CHECK(s["attachments"].empty());                             // --detach-on-exit ran
    CHECK(h.log(1).find("stopping") != std::string::npos);
}

TEST_CASE("agent process: SIGHUP re-reads the policy directory", "[agent][signals]") {
    Lab lab(lab_config("hup"));
    AgentHarness h(lab, "sighup");
    PolicyGen gen(lab, 2);
    h.publish(gen.invalid(1).files);
    h.start();
    REQUIRE(h.wait_status([](const json& s) { return applies_failed(s) == 1; }, 120s));
    // A revision that failed is not retried on its own; SIGHUP retries it.
    ::kill(h.pid(), SIGHUP);
    INFO("agent log:\n" << h.log_tail());
    CHECK(h.wait_status([](const json& s) { return applies_failed(s) == 2; }, 30s));
    CHECK(h.alive());
    CHECK(h.log(1).find("SIGHUP: re-reading") != std::string::npos);
    const int st = h.stop();
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("agent process: one agent per pin root, runtime files private", "[agent]") {
    Lab lab(lab_config("pin"));
    AgentHarness h(lab, "pinroot");
    PolicyGen gen(lab, 3);
    h.publish(gen.valid(1).files);
    // A link planted where the status used to be written through: never followed.
    const std::string victim = h.dir() + "/victim";
    std::ofstream(victim) << "keep\n";
    fs::create_symlink(victim, h.state_dir() + "/status.json.tmp");
    h.start();
    REQUIRE(h.wait_status([](const json& s) { return s.value("ready", false); }, 120s));
    CHECK(slurp(victim) == "keep\n");

    struct stat st {};
    REQUIRE(stat((h.state_dir() + "/status.json").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0640);
    const group* g = getgrnam("mpsteer");
    CHECK(st.st_gid == (g ? g->gr_gid : 0));
    REQUIRE(stat(h.state_dir().c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0750);
    REQUIRE(stat((h.state_dir() + "/events.jsonl").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0640);

    // A second agent with its own state directory on the same pin root.
    const std::string other_state = h.dir() + "/state-2";
    auto r = run({"timeout", "30", mpsteer_bin(), "run", "--policies", h.dir() + "/current",
                  "--state-dir", other_state, "--pin-root", h.pin_root(), "--netns",
                  lab.server_ns(), "-i", lab.server_if(1), "--metrics-port", "0"});
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("another mpsteer agent uses the pin root") != std::string::npos);
    CHECK(h.alive());
    CHECK(h.wait_status([](const json& s) { return s.value("ready", false); }, 10s));
}

namespace {
std::string hostile_script(const std::string& name) {
    return source("tests/unit/lua_hostile/" + name);
}

std::string hook_policy(const std::string& name, int priority, const std::string& script) {
    return "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata:\n  name: " + name +
           "\nspec:\n  attach: {hooks: [xdp]}\n  priority: " + std::to_string(priority) +
           "\n  select:\n    - packet_type: [any_mptcp]\n    - packet_type: [ack]\n"
           "  actions:\n    - set_backup: {backup: false}\n"
           "  hooks:\n    script: lua/" +
           script + "\n    every: 10ms\n";
}

}  // namespace

TEST_CASE("agent process: hostile hook scripts leave the agent ready, applying and stopping",
          "[agent][hooks][hostile]") {
    Lab lab(lab_config("hk"));
    AgentHarness h(lab, "hostile-hooks");
    // One script sorts 2^19 numbers in a loop, one writes the backup flag in a tight loop, one
    // allocates all it can; one behaves.
    Files files = {{"hooks.yaml", hook_policy("sorter", 100, "sort_numbers_loop.lua") + "---\n" +
                                      hook_policy("flood", 200, "write_loop.lua") + "---\n" +
                                      hook_policy("hoarder", 300, "alloc_all.lua") + "---\n" +
                                      hook_policy("good", 400, "good.lua")},
                   {"lua/sort_numbers_loop.lua", hostile_script("sort_numbers_loop.lua")},
                   {"lua/write_loop.lua", hostile_script("write_loop.lua")},
                   {"lua/alloc_all.lua", hostile_script("alloc_all.lua")},
                   {"lua/good.lua", "n = 0\nfunction on_tick() n = n + 1 end\n"}};
    h.publish(files);
    const pid_t pid = h.start();
    auto disabled = [](const json& s, const char* p) {
        const json* st = hook_of(s, p);
        return st && st->value("state", "") == "disabled";
    };
    REQUIRE(h.wait_status(
        [&](const json& s) {
            return s.value("ready", false) && disabled(s, "sorter") && disabled(s, "flood") &&
                   disabled(s, "hoarder");
        },
        120s, 100ms));
    json s = h.status();
    INFO(s["lua_hooks"].dump(1));
    INFO(s["hook_process"].dump(1));
    CHECK_FALSE(hook_of(s, "sorter")->value("last_error", "").empty());
    CHECK_FALSE(hook_of(s, "hoarder")->value("last_error", "").empty());
    CHECK(hook_of(s, "flood")->value("last_error", "").find("went on writing past") !=
          std::string::npos);
    CHECK(hook_of(s, "good")->value("state", "") == "running");
    CHECK(s["hook_process"].value("pid", 0) > 0);
    CHECK(s["hook_process"].value("pid", 0) != pid);
    CHECK(s["hook_process"].value("seccomp", false));
    // `mpsteer status` names the process and its restarts.
    auto text = run({mpsteer_bin(), "status", "--state-dir", h.state_dir()});
    INFO(text.out);
    CHECK(text.out.find("hook process: pid ") != std::string::npos);
    // The good script keeps ticking, a new revision is applied.
    const uint64_t calls = hook_of(s, "good")->value("calls", uint64_t(0));
    REQUIRE(h.wait_status(
        [&](const json& t) {
            const json* g = hook_of(t, "good");
            return g && g->value("calls", uint64_t(0)) > calls + 10;
        },
        20s, 100ms));
    files["lua/good.lua"] = "n = 1\nfunction on_tick() n = n + 1 end\n";
    const std::string rev = h.publish(files);
    REQUIRE(h.wait_status(
        [&](const json& t) {
            return t.value("applied_revision", "") == rev && t.value("ready", false);
        },
        30s, 50ms));
    // SIGTERM: exit 0 within 5 s.
    const auto t0 = std::chrono::steady_clock::now();
    const int st = h.stop();
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
}
