// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Manifest loading and validation: the invalid corpus (one mistake per file, its expected
// FILE:LINE:COL lines in the file's header), the valid examples, the shipped policies, and
// the YAML -> typed JSON details.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <catch2/catch.hpp>

#include "compile/compile.h"
#include "manifest/manifest.h"

using namespace mpsteer::manifest;
namespace fs = std::filesystem;

namespace {

const fs::path kManifests = fs::path(MPS_SOURCE_DIR) / "tests/unit/manifests";

Options test_options() {
    Options o;
    o.known_interfaces = std::set<std::string>{"lo", "eth0", "eth1"};
    o.repo_root = kManifests.string();
    return o;
}

std::vector<std::string> lines_with(const Result& r, Severity sev, const fs::path& dir) {
    std::vector<std::string> out;
    for (auto d : r.diagnostics) {
        if (d.severity != sev) continue;
        d.pos.file = fs::path(d.pos.file).lexically_relative(dir).string();
        std::string line = d.format(), prefix = dir.string() + "/";
        for (size_t at; (at = line.find(prefix)) != std::string::npos;)
            line.erase(at, prefix.size());
        out.push_back(line);
    }
    return out;
}

std::vector<std::string> expected_of(const fs::path& file) {
    std::ifstream in(file);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);)
        if (line.rfind("# expect: ", 0) == 0) out.push_back(line.substr(10));
    return out;
}

Result load_text(const std::string& text, Options o = test_options()) {
    return load_sources({{(kManifests / "inline.yaml").string(), text}}, o);
}

const char* kPolicy = R"(apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: p}
spec:
  attach: {hooks: [xdp]}
  priority: 1
  actions:
    - record: {}
)";

// A Balancer on `clients` with one service and one backend behind `backend_if`.
std::string one_backend_balancer(const std::string& clients, const std::string& backend_if) {
    return "apiVersion: mpsteer.dev/v1\nkind: Balancer\nmetadata: {name: web}\nspec:\n"
           "  interfaces: [" +
           clients +
           "]\n  services: [{vip: 203.0.113.10, ports: [443]}]\n"
           "  backends: [{name: web1, mac: \"02:00:00:00:00:01\", interface: " +
           backend_if + "}]\n";
}

}  // namespace

TEST_CASE("every invalid manifest reports exactly its expected errors", "[manifest]") {
    const fs::path dir = kManifests / "invalid";
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".yaml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 40);
    std::set<std::string> mistakes;
    for (const auto& f : files) {
        INFO(f.filename().string());
        auto expected = expected_of(f);
        REQUIRE_FALSE(expected.empty());
        auto r = load_paths({f.string()}, test_options());
        if (r.ok()) {  // the datapath's limits, as `mpsteer validate` checks them
            auto limits = mpsteer::compile::check_limits(r.model);
            r.diagnostics.insert(r.diagnostics.end(), limits.begin(), limits.end());
        }
        CHECK_FALSE(r.ok());
        CHECK(lines_with(r, Severity::error, dir) == expected);
        mistakes.insert(expected.front().substr(expected.front().find(": error: ")));
    }
    // Each file is a different mistake: no two share their first message.
    CHECK(mistakes.size() == files.size());
}

TEST_CASE("the valid examples load without errors", "[manifest]") {
    auto r = load_paths({(kManifests / "valid").string()}, test_options());
    INFO(lines_with(r, Severity::error, kManifests).size());
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    CHECK(r.files.size() == 3);
    CHECK(r.model.policies.size() == 6);
    CHECK(lines_with(r, Severity::warning, kManifests).empty());
    // Sorted by name; the shared selector set and action chain are inlined.
    REQUIRE(r.model.policies[3].name == "ingress-all-selectors");
    const Policy& p = r.model.policies[3];
    CHECK(p.select.size() == 14);  // the set's two selectors, flattened, plus twelve
    CHECK(p.select[0].describe() == "dst 10.0.1.0/24");
    CHECK(p.select[1].describe() == "port dst 443");
    CHECK(p.actions.size() == 6);
    CHECK(p.actions[0].kind == Action::Kind::record);
    CHECK(p.actions[5].rate_bytes_per_sec == 2500000);
    CHECK(p.actions[5].rtt_us == 50000);
    CHECK(p.actions[5].min_window == 8000);
    REQUIRE(p.lua);
    CHECK(p.lua->every_ms == 100);
    CHECK(p.lua->idle_every_ms == 2000);
    CHECK(p.lua->params["threshold_bytes"] == 220000);
    CHECK(fs::path(p.lua->path) == kManifests / "lua/probe.lua");
    CHECK(p.failure_mode == FailureMode::drop);
    CHECK(p.cont);
    CHECK(p.select[7].describe() == "ttl 1-5");
    CHECK(p.select[8].describe() == "dscp 46");
    CHECK(p.select[9].token == 0x1a2b3c4d);
    CHECK(p.select[12].hi == 65536);
}

TEST_CASE("the shipped policies are valid", "[manifest][policies]") {
    const fs::path root(MPS_SOURCE_DIR);
    Options o = test_options();
    // The interfaces the shipped policies name (multi-tenant uplinks, ECF's cellular path).
    o.known_interfaces = std::set<std::string>{"eth0", "eth1", "eth2", "wwan0"};
    o.repo_root = root.string();
    // Check the Lua scripts when they are present in this tree.
    o.check_scripts =
        fs::exists(root / "lua/ecf.lua") && fs::exists(root / "lua/small_flow_pm.lua");
    auto r = load_paths({(root / "policies").string()}, o);
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    CHECK(r.diagnostics.empty());
    std::set<std::string> names;
    for (const auto& p : r.model.policies) names.insert(p.name);
    for (const char* n :
         {"small-flow-single-path", "ecf-scheduler", "tenant-a-uplink-1", "tenant-a-uplink-2",
          "tenant-b-uplink-1", "tenant-b-uplink-2", "lb-no-subflows-to-vip",
          "lb-initial-subflow-backup", "mp-join-only-guard"})
        CHECK(names.count(n) == 1);
}

TEST_CASE("any valid YAML loads: the valid-YAML corpus", "[manifest]") {
    // Block and flow styles, quotes and braces in plain scalars, anchors, comments, BOM, CRLF.
    const fs::path dir = kManifests / "valid-yaml";
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".yaml") continue;
        ++files;
        INFO(e.path().filename().string());
        auto r = load_paths({e.path().string()}, test_options());
        for (const auto& d : r.diagnostics) INFO(d.format());
        CHECK(r.ok());
        CHECK(!r.model.policies.empty());
    }
    CHECK(files >= 7);
}

TEST_CASE("YAML scalars are typed with the core schema; quoted ones stay strings", "[manifest]") {
    SECTION("quoted integer priority is a string") {
        std::string t = kPolicy;
        t.replace(t.find("priority: 1"), 11, "priority: \"1\"");
        auto r = load_text(t);
        REQUIRE(r.diagnostics.size() == 1);
        CHECK(r.diagnostics[0].message == "expected integer, got string '1'");
        CHECK(r.diagnostics[0].pos.line == 6);
        CHECK(r.diagnostics[0].pos.col == 13);
    }
    SECTION("hex and octal integers") {
        std::string t = kPolicy;
        t.replace(t.find("priority: 1"), 11, "priority: 0x10");
        auto r = load_text(t);
        REQUIRE(r.ok());
        CHECK(r.model.policies[0].priority == 16);
    }
    SECTION("null for an empty value is reported at its key") {
        std::string t = kPolicy;
        t.replace(t.find("priority: 1"), 11, "priority:");
        auto r = load_text(t);
        REQUIRE(r.diagnostics.size() == 1);
        CHECK(r.diagnostics[0].format().ends_with(
            ":6:3: error: /spec/priority: expected integer, got null"));
    }
    SECTION("an empty file and comment-only documents are no error") {
        CHECK(load_text("").ok());
        CHECK(load_text("# nothing\n---\n").ok());
    }
}

TEST_CASE("every error is reported, sorted, across files and documents", "[manifest]") {
    std::string bad1 = kPolicy, bad2 = kPolicy;
    bad1.replace(bad1.find("priority: 1"), 11, "priority: -1");
    bad2.replace(bad2.find("name: p"), 7, "name: q");
    bad2.replace(bad2.find("[xdp]"), 5, "[xpd]");
    bad2 += "  bogus: 1\n";
    auto r = load_sources({{"b.yaml", bad2 + "---\n" + bad1}, {"a.yaml", bad1}}, test_options());
    std::vector<std::string> got;
    for (const auto& d : r.diagnostics) got.push_back(d.format());
    CHECK(got ==
          std::vector<std::string>{
              "a.yaml:6:13: error: /spec/priority: -1 is out of range (0 to 65535)",
              "b.yaml:5:20: error: /spec/attach/hooks/0: 'xpd' is not one of: xdp, "
              "tc_egress, tc_ingress; did you mean 'xdp'?",
              "b.yaml:9:3: error: /spec/bogus: unknown property 'bogus' (expected one of: "
              "actions, attach, continue, failure_mode, hooks, priority, select)",
              "b.yaml:13:18: error: /metadata/name: policy 'p' is already defined at a.yaml:1:1",
              "b.yaml:16:13: error: /spec/priority: -1 is out of range (0 to 65535)",
          });
}

TEST_CASE("unknown interfaces are warnings, not errors", "[manifest]") {
    std::string t = kPolicy;
    t.replace(t.find("{hooks: [xdp]}"), 14, "{interfaces: [eht0], hooks: [xdp]}");
    auto r = load_text(t);
    REQUIRE(r.ok());
    REQUIRE(r.diagnostics.size() == 1);
    CHECK(r.diagnostics[0].severity == Severity::warning);
    CHECK(r.diagnostics[0].message ==
          "interface 'eht0' does not exist on this host; did you mean 'eth0'?");
}

TEST_CASE("hostile YAML stays cheap", "[manifest]") {
    // An alias bomb: 10 levels of 10 references would expand to 10^10 nodes.
    std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i < 10; ++i) {
        bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
        for (int j = 0; j < 10; ++j) bomb += (j ? ", *a" : "*a") + std::to_string(i - 1);
        bomb += "]\n";
    }
    auto r = load_text(bomb);
    CHECK_FALSE(r.ok());
    CHECK(r.diagnostics.size() <= 3);
    auto self = load_text("&a [*a]\n");
    CHECK_FALSE(self.ok());
    // A quoted scalar followed by ',' is reported at the ','.
    auto comma = load_text("a: 'x', b\n");
    REQUIRE(comma.diagnostics.size() == 1);
    CHECK(comma.diagnostics[0].format().ends_with(
        "inline.yaml:1:7: error: yaml: unexpected ',' outside [ ] or { }"));
    // yaml-cpp 0.7 produces empty documents forever at a ',' where a document would start.
    auto start = load_text(std::string(kPolicy) + ", x\n");
    REQUIRE(start.diagnostics.size() == 1);
    CHECK(start.diagnostics[0].format().ends_with(
        "inline.yaml:9:1: error: yaml: unexpected ',' outside [ ] or { }"));
    CHECK_FALSE(load_text(",").ok());
    CHECK_FALSE(load_text("a:\n  - x\n ,b: 1\n").ok());
    for (const auto& d : load_text("a: ['x', 'y']\nb: {c: 'd', e: f}\n").diagnostics)
        CHECK(d.message.find("unexpected ','") == std::string::npos);  // commas in flow are fine
    CHECK(load_text(std::string(kPolicy) + "  description_x: a , b\n").diagnostics.size() == 1);
    // Invalid UTF-8 stops at the converter (valijson reads past the end of such strings).
    auto bad = load_text(std::string(kPolicy) + "  x: \"\xff\xfe\"\n");
    REQUIRE_FALSE(bad.ok());
    CHECK(
        bad.diagnostics[0].format().ends_with("inline.yaml:9:7: error: invalid UTF-8 (byte 0xff)"));
    // An escape that decodes to invalid UTF-8 is caught in the scalar.
    auto escaped = load_text(std::string(kPolicy) + "  x: \"\\ud800\"\n");
    REQUIRE_FALSE(escaped.ok());
}

TEST_CASE("a 1 MB manifest validates in linear time", "[manifest]") {
    // Each shape fills about 1 MB with one long list; the ones the caps refuse must be refused
    // as fast as the largest accepted manifest validates. Quadratic work (every pair of list
    // items compared, or every error against every other) takes minutes at this size. Linear
    // time is asserted as a ratio of the same shape at a quarter of the size (4 when linear, 16
    // when quadratic), not as seconds: under qemu-user the same work takes ten times as long.
    auto fill = [](std::string text, const std::function<std::string(size_t)>& item, size_t size) {
        for (size_t i = 0; text.size() + 16 < size; ++i) text += item(i);
        return text;
    };
    const std::string head =
        "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: p}\n"
        "spec:\n  priority: 1\n  actions: [record: {}]\n";
    struct Shape {
        const char* name;
        std::function<std::string(size_t)> text;
        bool valid;
    };
    auto long_list = [&](std::string start, std::function<std::string(size_t)> item) {
        return [=](size_t size) { return fill(start, item, size); };
    };
    const std::vector<Shape> shapes = {
        {"distinct interfaces",
         long_list(head + "  attach:\n    hooks: [xdp]\n    interfaces:\n",
                   [](size_t i) { return "      - e" + std::to_string(i) + "\n"; }),
         false},
        {"one interface repeated",
         long_list(head + "  attach:\n    hooks: [xdp]\n    interfaces:\n",
                   [](size_t) { return std::string("      - eth0\n"); }),
         false},
        {"one packet type repeated",
         long_list(head + "  attach: {hooks: [xdp]}\n  select:\n    - packet_type:\n",
                   [](size_t) { return std::string("        - syn\n"); }),
         false},
        {"unknown selectors",
         long_list(head + "  attach: {hooks: [xdp]}\n  select:\n",
                   [](size_t) { return std::string("    - dsst: 10.0.0.0/24\n"); }),
         false},
        {"long parameter lists in 32 policies (the most with hook scripts)",
         [&](size_t size) {
             std::string text;
             for (int doc = 0; doc < 32; ++doc) {
                 std::string d = std::string(doc ? "---\n" : "") +
                                 "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: p" +
                                 std::to_string(doc) +
                                 "}\nspec:\n  priority: " + std::to_string(doc) +
                                 "\n  attach: {hooks: [xdp]}\n  actions: [record: {}]\n"
                                 "  hooks:\n    script: lua/probe.lua\n    params:\n      xs:\n";
                 text += fill(
                     d, [](size_t i) { return "        - " + std::to_string(i) + "\n"; },
                     size / 32);
             }
             return text;
         },
         true},
    };
    auto seconds_to_validate = [](const std::string& text, const Shape& shape) {
        const auto start = std::chrono::steady_clock::now();
        auto r = load_text(text);
        if (r.ok()) {
            auto limits = mpsteer::compile::check_limits(r.model);
            r.diagnostics.insert(r.diagnostics.end(), limits.begin(), limits.end());
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        WARN(shape.name << ": " << text.size() << " bytes in " << seconds << " s, "
                        << r.diagnostics.size() << " diagnostics");
        CHECK(r.ok() == shape.valid);
        return seconds;
    };
    constexpr size_t kSize = 1 << 20;
    for (const auto& shape : shapes) {
        INFO(shape.name);
        const auto quarter = shape.text(kSize / 4), whole = shape.text(kSize);
        REQUIRE(whole.size() >= kSize - 4096);
        // The least of a few runs each: another process's burst makes a run slower, never
        // faster. The 20 ms cover a clock's granularity and the fixed cost at the small size.
        const double small =
            std::min({seconds_to_validate(quarter, shape), seconds_to_validate(quarter, shape),
                      seconds_to_validate(quarter, shape)});
        const double large =
            std::min(seconds_to_validate(whole, shape), seconds_to_validate(whole, shape));
        CHECK(large < 10 * small + 0.02);
    }
}

TEST_CASE("number parsers", "[manifest]") {
    CHECK(parse_rate_bytes_per_sec("20Mbit") == 2500000u);
    CHECK(parse_rate_bytes_per_sec("1.5Gbit") == 187500000u);
    CHECK(parse_rate_bytes_per_sec("2MB/s") == 2000000u);
    CHECK(parse_rate_bytes_per_sec("500kbit") == 62500u);
    CHECK_FALSE(parse_rate_bytes_per_sec("20Mbps"));
    CHECK(parse_duration_us("100ms") == 100000u);
    CHECK(parse_duration_us("2m") == 120000000u);
    CHECK_FALSE(parse_duration_us("1h"));
    CHECK(parse_ip("2001:db8::1")->family == 6);
    CHECK_FALSE(parse_ip("10.0.0.256"));
}

TEST_CASE("each action is accepted on exactly the hooks of its table, and the hint names them",
          "[manifest]") {
    const std::vector<std::pair<Action::Kind, std::string>> actions = {
        {Action::Kind::pass, "pass: {}"},
        {Action::Kind::drop, "drop: {}"},
        {Action::Kind::record, "record: {}"},
        {Action::Kind::get_connect, "get_connect: {}"},
        {Action::Kind::get_subflow, "get_subflow: {}"},
        {Action::Kind::rate_limit, "rate_limit: {rate: 20Mbit}"},
        {Action::Kind::blk_subflow, "blk_subflow: {}"},
        {Action::Kind::add_subflow, "add_subflow: {}"},
        {Action::Kind::set_backup, "set_backup: {}"},
        {Action::Kind::no_subflows, "no_subflows: {}"},
        {Action::Kind::redirect, "redirect: {interface: eth1}"},
    };
    for (const auto& [kind, text] : actions) {
        auto allowed = allowed_hooks(kind);
        CHECK(std::is_sorted(allowed.begin(), allowed.end()));
        std::string hint;
        for (auto h : allowed) hint += (hint.empty() ? "" : " or ") + std::string(to_string(h));
        for (auto hook : mpsteer::kHooks) {
            INFO(text << " on " << to_string(hook));
            bool in_table = std::find(allowed.begin(), allowed.end(), hook) != allowed.end();
            CHECK(applicable(kind, hook) == in_table);
            std::string t = kPolicy;
            t.replace(t.find("[xdp]"), 5, "[" + std::string(to_string(hook)) + "]");
            t.replace(t.find("record: {}"), 10, text);
            auto r = load_text(t);
            CHECK(r.ok() == in_table);
            if (in_table) continue;
            REQUIRE(r.diagnostics.size() == 1);
            CHECK(r.diagnostics[0].message ==
                  "action '" + std::string(to_string(kind)) + "' cannot run on hook '" +
                      std::string(to_string(hook)) + "' of policy 'p' (use " + hint + ")");
        }
    }
}

TEST_CASE("a balancer loads into the model: services per VIP and port, backends as written",
          "[manifest][balancer]") {
    auto r = load_text(R"(apiVersion: mpsteer.dev/v1
kind: Balancer
metadata: {name: web}
spec:
  interfaces: [eth1, eth0]
  services:
    - {vip: 203.0.113.10, ports: [443, 80]}
    - {vip: "2001:db8::10", ports: [443]}
  backends:
    - {name: web2, mac: "02:00:00:00:00:0B", interface: eth1, weight: 3}
    - {name: web1, mac: "02:00:00:00:00:0a", interface: eth1, draining: true}  # one-armed
  unknown_token: reset
  tables: {subflows: 2097152, tokens: 1048576}
---
apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: p}
spec:
  attach: {hooks: [xdp, tc_egress]}  # every interface: the balancer's XDP is left out
  priority: 10
  actions:
    - record: {}
)");
    std::string diags;
    for (const auto& d : r.diagnostics) diags += d.format() + "\n";
    INFO(diags);
    REQUIRE(r.ok());
    CHECK(r.diagnostics.empty());
    REQUIRE(r.model.balancer);
    const Balancer& b = *r.model.balancer;
    CHECK(b.name == "web");
    CHECK(b.interfaces == std::vector<std::string>{"eth0", "eth1"});
    REQUIRE(b.services.size() == 3);  // sorted: IPv4 before IPv6, ports ascending
    CHECK(to_string(b.services[0].vip) == "203.0.113.10");
    CHECK(b.services[0].port == 80);
    CHECK(b.services[1].port == 443);
    CHECK(to_string(b.services[2].vip) == "2001:db8::10");
    REQUIRE(b.backends.size() == 2);
    CHECK(b.backends[0].name == "web2");
    CHECK(b.backends[0].mac == std::array<uint8_t, 6>{2, 0, 0, 0, 0, 0x0b});
    CHECK(b.backends[0].weight == 3);
    CHECK_FALSE(b.backends[0].draining);
    CHECK(b.backends[1].draining);
    CHECK(b.backends[1].weight == 1);
    CHECK(b.reset_unknown_tokens);
    CHECK(b.subflow_table == 2097152);
    CHECK(b.token_table == 1048576);
    REQUIRE(r.model.policies.size() == 1);

    // Any error anywhere: no balancer is handed out either.
    auto bad = load_text(one_backend_balancer("eth0", "eth1") + R"(---
apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: p}
spec:
  attach: {hooks: [xdp]}
  priority: 100000
  actions: [{record: {}}]
)");
    CHECK_FALSE(bad.ok());
    CHECK_FALSE(bad.model.balancer);
}

TEST_CASE("a balancer on an interface this host lacks is a warning at validation, not an error",
          "[manifest][balancer]") {
    auto r = load_text(one_backend_balancer("eth9", "eth0"));
    REQUIRE(r.ok());
    REQUIRE(r.diagnostics.size() == 1);
    CHECK(r.diagnostics[0].format() ==
          (kManifests / "inline.yaml").string() +
              ":5:16: warning: /spec/interfaces/0: interface 'eth9' does not exist on this host; "
              "did you mean 'eth0'?");
}
