// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The compiler: step encoding, branch layout, entries per hook and interface, determinism,
// and the plan model / diff.
#include <arpa/inet.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <catch2/catch.hpp>

#include "compile/compile.h"

using namespace mpsteer;
namespace fs = std::filesystem;

namespace {

manifest::Options opts() {
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{"lo", "eth0", "eth1", "eth2"};
    o.check_scripts = false;
    return o;
}

manifest::Model model_of(const std::string& yaml) {
    auto r = manifest::load_sources({{"t.yaml", yaml}}, opts());
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    return r.model;
}

std::string policy(const std::string& name, const std::string& attach, int prio,
                   const std::string& select, const std::string& actions,
                   const std::string& extra = "") {
    return "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: " + name +
           "}\nspec:\n  attach: " + attach + "\n  priority: " + std::to_string(prio) + "\n" +
           extra + (select.empty() ? "" : "  select:\n" + select) + "  actions:\n" + actions;
}

}  // namespace

TEST_CASE("selector parameters are encoded for the datapath", "[compile]") {
    auto m = model_of(policy(
        "p", "{hooks: [xdp]}", 1,
        "    - dst: 10.0.1.0/24\n"
        "    - src: 2001:db8::/33\n"
        "    - port: {src: 1000-2000}\n"
        "    - packet_type: [add_addr, syn]\n"
        "    - token: 0xdeadbeef\n"
        "    - subflow: {a: {address: 10.0.0.1, port: 5000}, b: {address: 10.0.0.2, port: 80}}\n"
        "    - flow_bytes: {scope: connection, from: 1KB, to: 2KiB}\n"
        "    - sequence: {kind: data, from: 5}\n",
        "    - rate_limit: {rate: 8Mbit, rtt: 10ms, min_window: 4096}\n"));
    auto out = compile::compile(m);
    const auto& s = out.chains.steps;
    REQUIRE(s.size() == 9);
    // Every inline selector is one match step: tests on words of the packet.
    auto test_is = [](const mps_step& st, unsigned i, mps_word w, uint32_t mask, uint32_t lo,
                      uint32_t hi) {
        return st.prog == MPS_SEL_MATCH && i < st.p.match.n && st.p.match.word[i] == w &&
               st.p.match.mask[i] == mask && st.p.match.lo[i] == lo && st.p.match.hi[i] == hi;
    };
    CHECK(s[0].p.match.families == MPS_FAMILY_V4);
    CHECK(s[0].p.match.n == 1);
    CHECK(s[0].p.match.flags == 0);
    CHECK(test_is(s[0], 0, MPS_W_DST, htonl(0xffffff00), htonl(0x0a000100), htonl(0x0a000100)));
    CHECK(s[1].p.match.families == MPS_FAMILY_V6);
    CHECK(s[1].p.match.n == 2);  // /33: the first two words
    CHECK(test_is(s[1], 0, MPS_W_SRC, ~0u, htonl(0x20010db8), htonl(0x20010db8)));
    CHECK(test_is(s[1], 1, mps_word(MPS_W_SRC + 1), htonl(0x80000000), 0, 0));
    CHECK(s[2].p.match.families == (MPS_FAMILY_V4 | MPS_FAMILY_V6));
    CHECK(test_is(s[2], 0, MPS_W_SPORT, 0xffff, 1000, 2000));
    CHECK(s[2].p.match.flags == 0);
    CHECK(test_is(s[3], 0, MPS_W_KINDS, MPS_K_ADD_ADDR | MPS_K_SYN, 1, ~0u));
    CHECK(s[3].p.match.flags == MPS_MATCHF_KINDS);
    CHECK(s[4].p.token.token == 0xdeadbeef);
    CHECK(s[5].p.match.flags == MPS_MATCHF_EITHER);
    CHECK(s[5].p.match.n == 3);
    CHECK(test_is(s[5], 0, MPS_W_SRC, ~0u, htonl(0x0a000001), htonl(0x0a000001)));
    CHECK(test_is(s[5], 1, MPS_W_DST, ~0u, htonl(0x0a000002), htonl(0x0a000002)));
    CHECK(test_is(s[5], 2, MPS_W_PORTS, ~0u, 5000u << 16 | 80, 5000u << 16 | 80));
    CHECK(s[6].p.bytes.scope == MPS_BYTES_CONN);
    CHECK(s[6].p.bytes.lo == 1000);
    CHECK(s[6].p.bytes.hi == 2048);
    CHECK(s[7].p.seq.kind == MPS_SEQ_DATA);
    CHECK(s[7].p.seq.lo == 5);
    CHECK(s[7].p.seq.hi == UINT64_MAX);
    CHECK(s[8].prog == MPS_ACT_RATE_LIMIT);
    CHECK(s[8].p.rate.bytes_per_sec == 1000000);
    CHECK(s[8].p.rate.rtt_us == 10000);
    CHECK(s[8].p.rate.min_window == 4096);
    // A plain AND: every match goes on, every miss ends (no next policy).
    for (size_t pc = 0; pc < 8; ++pc) {
        CHECK(s[pc].on_match == pc + 1);
        CHECK(s[pc].on_miss == MPS_PC_END);
    }
    CHECK(s[8].on_match == MPS_PC_END);
    CHECK(out.chains.check().empty());
}

TEST_CASE("ttl and dscp are tests on the IP header's word", "[compile]") {
    auto m = model_of(policy("p", "{hooks: [xdp]}", 1,
                             "    - ttl: \"1-5\"\n"
                             "    - dscp: 46\n",
                             "    - drop: {}\n"));
    const auto& s = compile::compile(m).chains.steps;
    REQUIRE(s.size() == 3);
    for (const auto& st : {s[0], s[1]}) {
        CHECK(st.prog == MPS_SEL_MATCH);
        CHECK(st.p.match.n == 1);
        CHECK(st.p.match.word[0] == MPS_W_IP);
        CHECK(st.p.match.flags == MPS_MATCHF_IP);
        CHECK(st.p.match.families == (MPS_FAMILY_V4 | MPS_FAMILY_V6));
    }
    CHECK(s[0].p.match.mask[0] == 0xff);  // TTL: the word's low byte
    CHECK(s[0].p.match.lo[0] == 1);
    CHECK(s[0].p.match.hi[0] == 5);
    CHECK(s[1].p.match.mask[0] == 0xfc00);  // DSCP: the TOS's upper six bits
    CHECK(s[1].p.match.lo[0] == 46u << 10);
    CHECK(s[1].p.match.hi[0] == 46u << 10);
    CHECK(compile::compile(m).chains.check().empty());
}

TEST_CASE("any and not become branch targets", "[compile]") {
    // select: A and (B or not C), then one action.
    auto m = model_of(policy("p", "{hooks: [xdp]}", 1,
                             "    - port: {dst: 1}\n"
                             "    - any:\n"
                             "        - port: {dst: 2}\n"
                             "        - not: {port: {dst: 3}}\n",
                             "    - record: {}\n"));
    const auto& s = compile::compile(m).chains.steps;
    REQUIRE(s.size() == 4);
    CHECK((s[0].on_match == 1 && s[0].on_miss == MPS_PC_END));  // A
    CHECK((s[1].on_match == 3 && s[1].on_miss == 2));           // B: match -> action
    CHECK((s[2].on_match == MPS_PC_END && s[2].on_miss == 3));  // C: miss -> action
    CHECK(s[3].prog == MPS_ACT_RECORD);
}

TEST_CASE("policies on one hook run by priority; a miss falls to the next", "[compile]") {
    auto m = model_of(
        policy("late", "{hooks: [xdp]}", 20, "    - port: {dst: 2}\n", "    - drop: {}\n") +
        "---\n" +
        policy("early", "{hooks: [xdp]}", 10, "    - port: {dst: 1}\n", "    - record: {}\n",
               "  continue: true\n  failure_mode: drop\n"));
    auto out = compile::compile(m);
    const auto& c = out.chains;
    CHECK(c.policies == std::vector<std::string>{"early", "late"});
    REQUIRE(c.entries.size() == 1);
    CHECK(c.entries[0].ifname.empty());
    CHECK(c.entries[0].pc == 0);
    REQUIRE(c.steps.size() == 4);
    CHECK(c.steps[0].policy == 0);
    CHECK(c.steps[0].on_miss == 2);   // early misses -> late
    CHECK(c.steps[1].on_match == 2);  // continue: after early's actions, late
    CHECK(c.steps[0].flags == MPS_STEPF_FAIL_DROP);
    CHECK(c.steps[1].flags == MPS_STEPF_FAIL_DROP);
    CHECK(c.steps[2].flags == 0);
    CHECK(c.steps[3].prog == MPS_ACT_DROP);
    CHECK(c.steps[3].policy == 1);
    CHECK(c.attachments == std::vector<datapath::Attachment>{{"", datapath::Hook::xdp}});
}

TEST_CASE("different interface lists give per-interface entries with their own steps",
          "[compile]") {
    auto m =
        model_of(policy("all", "{hooks: [tc_egress]}", 10, "", "    - record: {}\n") + "---\n" +
                 policy("e1", "{interfaces: [eth1], hooks: [tc_egress, xdp]}", 5, "",
                        "    - redirect: {interface: eth2}\n"));
    auto out = compile::compile(m);
    const auto& c = out.chains;
    // xdp: only e1 (eth1); tc_egress: "" -> all, eth1 -> e1 then all.
    REQUIRE(c.entries.size() == 3);
    CHECK(c.entries[0].hook == datapath::Hook::xdp);
    CHECK(c.entries[0].ifname == "eth1");
    CHECK(c.entries[1].hook == datapath::Hook::tc_egress);
    CHECK(c.entries[1].ifname == "");
    CHECK(c.entries[2].ifname == "eth1");
    CHECK(c.steps.size() == 4);  // xdp: redirect; tc "": record; tc eth1: redirect, record
    CHECK(c.steps[c.entries[2].pc].prog == MPS_ACT_REDIRECT);
    // redirect names its interface for the loader; ifindex is left to it.
    CHECK(c.step_ifnames ==
          std::vector<std::pair<uint16_t, std::string>>{{0, "eth2"}, {2, "eth2"}});
    CHECK(c.attachments == std::vector<datapath::Attachment>{{"eth1", datapath::Hook::xdp},
                                                             {"", datapath::Hook::tc_egress},
                                                             {"eth1", datapath::Hook::tc_egress}});
    CHECK(c.check().empty());
}

TEST_CASE("rate_limit attaches the other direction to learn handshakes where nothing does",
          "[compile]") {
    const std::string limit = "    - rate_limit: {rate: 8Mbit}\n";
    SECTION("at tc_egress alone: tc_ingress learns on the same interfaces") {
        auto c = compile::compile(model_of(policy("rl", "{interfaces: [eth1], hooks: [tc_egress]}",
                                                  1, "", limit)))
                     .chains;
        CHECK(c.attachments ==
              std::vector<datapath::Attachment>{{"eth1", datapath::Hook::tc_egress},
                                                {"eth1", datapath::Hook::tc_ingress}});
        CHECK(c.learning_hooks == std::vector<datapath::Hook>{datapath::Hook::tc_ingress});
        CHECK(c.entries.size() == 1);  // nothing runs at tc_ingress
        CHECK(c.describe().find("learn tc_ingress (handshakes)") != std::string::npos);
        CHECK(c.check().empty());
    }
    SECTION("at xdp on every interface: tc_egress learns on every interface") {
        auto c = compile::compile(model_of(policy("rl", "{hooks: [xdp]}", 1, "", limit))).chains;
        CHECK(c.attachments == std::vector<datapath::Attachment>{{"", datapath::Hook::xdp},
                                                                 {"", datapath::Hook::tc_egress}});
        CHECK(c.learning_hooks == std::vector<datapath::Hook>{datapath::Hook::tc_egress});
    }
    SECTION("a chain on the other direction learns already: nothing added") {
        auto c =
            compile::compile(
                model_of(policy("rl", "{interfaces: [eth1], hooks: [tc_egress]}", 1, "", limit) +
                         "---\n" + policy("rec", "{hooks: [xdp]}", 2, "", "    - record: {}\n")))
                .chains;
        CHECK(c.attachments == std::vector<datapath::Attachment>{
                                   {"", datapath::Hook::xdp}, {"eth1", datapath::Hook::tc_egress}});
        CHECK(c.learning_hooks.empty());
    }
    SECTION("the learning hooks survive the applied state's JSON") {
        auto m = model_of(policy("rl", "{hooks: [tc_egress]}", 1, "", limit));
        auto plan = compile::make_plan_model(m, compile::compile(m), "r");
        auto back =
            compile::plan_model_from_json(nlohmann::json::parse(compile::to_json(plan).dump()));
        CHECK(back.chains.learning_hooks == plan.chains.learning_hooks);
        CHECK(back.chains.serialize() == plan.chains.serialize());
        auto d = compile::diff({}, plan);
        REQUIRE(d.learning.size() == 1);
        CHECK(compile::to_text(d).find("hook tc_ingress on every interface: learns handshakes "
                                       "only") != std::string::npos);
    }
}

TEST_CASE("pass and drop end the chain even with continue", "[compile]") {
    auto m = model_of(policy("a", "{hooks: [xdp]}", 1, "", "    - pass: {}\n") + "---\n" +
                      policy("b", "{hooks: [xdp]}", 2, "", "    - record: {}\n"));
    const auto& s = compile::compile(m).chains.steps;
    CHECK(s[0].on_match == MPS_PC_END);
}

TEST_CASE("compilation is deterministic whatever the file and document order", "[compile]") {
    const fs::path dir = fs::path(MPS_SOURCE_DIR) / "tests/unit/manifests/valid";
    auto a = manifest::load_paths({dir.string()}, opts());
    REQUIRE(a.ok());
    auto out1 = compile::compile(a.model);
    auto out2 = compile::compile(a.model);
    CHECK(out1.chains.serialize() == out2.chains.serialize());
    // The same documents in reverse file order.
    std::vector<std::string> files = a.files;
    std::reverse(files.begin(), files.end());
    auto b = manifest::load_paths(files, opts());
    REQUIRE(b.ok());
    CHECK(compile::compile(b.model).chains.serialize() == out1.chains.serialize());
    CHECK(out1.chains.check().empty());
    CHECK(compile::to_json(compile::make_plan_model(a.model, out1)).dump() ==
          compile::to_json(compile::make_plan_model(b.model, out2)).dump());
}

TEST_CASE("shipped policies compile into valid chains", "[compile][policies]") {
    auto o = opts();
    auto r = manifest::load_paths({(fs::path(MPS_SOURCE_DIR) / "policies").string()}, o);
    REQUIRE(r.ok());
    auto out = compile::compile(r.model);
    CHECK(out.chains.check().empty());
    CHECK(out.step_text.size() == out.chains.steps.size());
}

TEST_CASE("too many steps for the datapath is a compile error", "[compile]") {
    std::string docs;
    std::string select;
    for (int i = 0; i < 30; ++i) select += "    - port: {dst: " + std::to_string(i) + "}\n";
    for (int i = 0; i < 40; ++i) {
        if (i) docs += "---\n";
        docs += policy("p" + std::to_string(i),
                       "{interfaces: [eth" + std::to_string(i % 3) + "], hooks: [xdp]}", i, select,
                       "    - record: {}\n");
    }
    auto r = manifest::load_sources({{"t.yaml", docs}}, opts());
    // 40 x 31 steps fit no step table; per-interface chains are still too long too.
    if (r.ok())
        CHECK_THROWS_AS(compile::compile(r.model), compile::Error);
    else
        CHECK_FALSE(r.ok());
}

TEST_CASE("plan model round-trips through JSON and diffs", "[compile][plan]") {
    auto old_m = model_of(
        policy("keep", "{hooks: [xdp]}", 1, "", "    - record: {}\n", "  continue: true\n") +
        "---\n" +
        policy("change", "{hooks: [xdp]}", 2, "    - port: {dst: 1}\n", "    - drop: {}\n") +
        "---\n" + policy("gone", "{hooks: [tc_egress]}", 3, "", "    - record: {}\n"));
    auto new_m = model_of(
        policy("keep", "{hooks: [xdp]}", 1, "", "    - record: {}\n", "  continue: true\n") +
        "---\n" +
        policy("change", "{hooks: [xdp]}", 2, "    - port: {dst: 2}\n", "    - drop: {}\n") +
        "---\n" + policy("new", "{hooks: [tc_ingress]}", 3, "", "    - record: {}\n"));
    auto running = compile::make_plan_model(old_m, compile::compile(old_m), "rev1");
    auto next = compile::make_plan_model(new_m, compile::compile(new_m), "rev2");

    auto back =
        compile::plan_model_from_json(nlohmann::json::parse(compile::to_json(running).dump()));
    CHECK(back.chains.serialize() == running.chains.serialize());
    CHECK(back.policies == running.policies);
    CHECK(back.revision == "rev1");

    auto d = compile::diff(running, next);
    CHECK(d.added == std::vector<std::string>{"new"});
    CHECK(d.changed == std::vector<std::string>{"change"});
    CHECK(d.removed == std::vector<std::string>{"gone"});
    CHECK(d.unchanged == std::vector<std::string>{"keep"});
    INFO(compile::to_text(d));
    REQUIRE(d.hooks.size() == 3);
    CHECK((d.hooks[0].hook == "xdp" && d.hooks[0].status == "changed"));
    CHECK((d.hooks[1].hook == "tc_egress" && d.hooks[1].status == "removed"));
    CHECK((d.hooks[2].hook == "tc_ingress" && d.hooks[2].status == "added"));
    auto text = compile::to_text(d);
    CHECK(text.find("~ policy change (changed)") != std::string::npos);
    CHECK(text.find("1 to add, 1 to change, 1 to remove, 1 unchanged") != std::string::npos);

    // Against an empty generation everything is new; against itself nothing changes.
    auto fresh = compile::diff({}, next);
    CHECK(fresh.added.size() == 3);
    auto same = compile::diff(next, next);
    CHECK(same.empty());
    for (const auto& h : same.hooks) CHECK(h.status == "unchanged");
    CHECK_FALSE(compile::read_applied("/nonexistent/applied.json"));
    CHECK_THROWS_AS(compile::plan_model_from_json(nlohmann::json::object()), compile::Error);
}

TEST_CASE("the plan shows the balancer added, changed and removed", "[compile][plan]") {
    const std::string lb =
        "apiVersion: mpsteer.dev/v1\nkind: Balancer\nmetadata: {name: web}\n"
        "spec:\n  interfaces: [eth0]\n"
        "  services: [{vip: 203.0.113.10, ports: [443]}]\n  backends:\n"
        "    - {name: web1, mac: \"02:00:00:00:00:01\", interface: eth1}\n";
    const std::string keep = policy("keep", "{hooks: [tc_egress]}", 1, "", "    - record: {}\n");
    auto without = model_of(keep);
    auto with = model_of(keep + "---\n" + lb);
    auto drained = with;
    drained.balancer->backends[0].draining = true;
    auto plan = [](const auto& m, const char* rev) {
        return compile::make_plan_model(m, compile::compile(m), rev);
    };
    const auto p0 = plan(without, "r0"), p1 = plan(with, "r1"), p2 = plan(drained, "r2");
    CHECK(p0.balancer.empty());
    auto back = compile::plan_model_from_json(nlohmann::json::parse(compile::to_json(p1).dump()));
    CHECK(back.balancer == p1.balancer);

    auto added = compile::diff(p0, p1);
    CHECK(added.balancer == "added");
    CHECK_FALSE(added.empty());
    CHECK(compile::to_text(added).find("+ balancer web (added)") != std::string::npos);
    auto changed = compile::diff(p1, p2);
    CHECK(changed.balancer == "changed");
    CHECK(compile::to_text(changed).find("~ balancer web (changed)") != std::string::npos);
    CHECK(compile::to_json(changed)["balancer"]["status"] == "changed");
    auto removed = compile::diff(p2, p0);
    CHECK(removed.balancer == "removed");
    auto same = compile::diff(p1, p1);
    CHECK(same.balancer == "unchanged");
    CHECK(same.empty());
    CHECK(compile::diff(p0, p0).balancer.empty());
}

TEST_CASE("every action's program is the registry's act_<its key>", "[compile]") {
    for (const char* key :
         {"pass", "drop", "record", "get_connect", "get_subflow", "rate_limit", "blk_subflow",
          "add_subflow", "set_backup", "no_subflows", "redirect", "reject"}) {
        INFO(key);
        auto kind = mpsteer::manifest::action_kind(key);
        REQUIRE(kind);
        CHECK(mpsteer::manifest::to_string(*kind) == key);
        auto prog = mpsteer::datapath::prog_from_name(std::string("act_") + key);
        REQUIRE(prog);
        CHECK(MPS_PROG_IS_ACTOR(*prog));
    }
    CHECK(mpsteer::manifest::action_kind("action_chain") == mpsteer::manifest::Action::Kind::ref);
    CHECK_FALSE(mpsteer::manifest::action_kind("rate-limit"));
}
