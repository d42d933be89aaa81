// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's rollout (src/agent/rollout.h) is a generation's one writer: the hooks' in-place
// writes (set_policy_backup) reach it through the StepWriteQueue and land in the generation
// they were meant for, and a write from a second thread is refused.
#include <catch2/catch.hpp>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "agent/rollout.h"
#include "bpf_env.h"
#include "lua/datapath_backend.h"
#include "lua/step_writes.h"

namespace fs = std::filesystem;
using namespace mpsteer;

namespace {
// A directory under /tmp, removed with everything in it.
struct TempDir {
    TempDir() {
        char tmpl[] = "/tmp/mps-rollout-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string path;
};

// The agent's configuration for a test: its directories, and the interfaces it manages.
agent::Config config_of(const TempDir& policies, const TempDir& state, const test::PinRoot& pins,
                        std::vector<std::string> interfaces) {
    agent::Config cfg;
    cfg.policies_dir = policies.path;
    cfg.state_dir = state.path;
    cfg.pin_root = pins.path();
    cfg.interfaces = std::move(interfaces);
    return cfg;
}

bool backup_flag(const agent::Rollout& r, uint32_t pc) {
    return r.running_generation()->chains.steps.at(pc).p.backup.backup;
}

// The XDP program on an interface, as "<name>#<id>".
std::string xdp_program(const char* ifname) {
    uint32_t id = 0;
    if (bpf_xdp_query_id(static_cast<int>(if_nametoindex(ifname)), 0, &id) || !id) return "none";
    const int fd = bpf_prog_get_fd_by_id(id);
    bpf_prog_info info{};
    __u32 len = sizeof info;
    bpf_obj_get_info_by_fd(fd, &info, &len);
    close(fd);
    return std::string(info.name) + "#" + std::to_string(id);
}
}  // namespace

TEST_CASE(
    "rollout: hooks' step writes reach the running generation through the queue, from "
    "one writer only",
    "[bpf][rollout]") {
    test::PinRoot pins;
    TempDir policies, state;
    std::ofstream(policies.path + "/p.yaml")
        << "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n"
           "  attach: {hooks: [tc_egress]}\n  priority: 100\n  select:\n    - dst: 192.0.2.7\n"
           "  actions:\n    - set_backup: {backup: true}\n";
    const auto cfg = config_of(policies, state, pins,
                               {"mps-absent0"});  // no such interface: nothing is attached
    auto maps = datapath::StateMaps::open(pins.path());
    agent::Rollout rollout(cfg, maps);
    auto outcome = rollout.apply(agent::snapshot(policies.path));
    INFO(outcome.message);
    REQUIRE(outcome.applied());
    const auto running = rollout.running_generation();
    REQUIRE(running);
    CHECK(running->number == outcome.generation);
    uint32_t pc = 0;
    while (pc < running->chains.steps.size() &&
           running->chains.steps[pc].prog != MPS_ACT_SET_BACKUP)
        ++pc;
    REQUIRE(pc < running->chains.steps.size());
    REQUIRE(backup_flag(rollout, pc));

    // The script's call counts the steps and queues the write; nothing changes until the owner
    // drains the queue.
    lua::FlowIds ids;
    lua::StepWriteQueue queue;
    lua::DatapathBackend backend(maps, ids, queue);
    CHECK_THROWS_WITH(backend.set_policy_backup("p", false),
                      "set_policy_backup: no generation is running");
    backend.set_running(running);
    CHECK(backend.set_policy_backup("p", false) == 1);
    CHECK_THROWS_WITH(backend.set_policy_backup("q", false),
                      "set_policy_backup: policy not running");
    pollfd p{queue.fd(), POLLIN, 0};
    CHECK(poll(&p, 1, 0) == 1);
    auto writes = queue.take();
    REQUIRE(writes.size() == 1);
    CHECK(poll(&p, 1, 0) == 0);
    CHECK(backup_flag(rollout, pc));

    // A second writer is refused and changes nothing.
    bool refused = false;
    std::thread([&] {
        try {
            rollout.write_steps(writes);
        } catch (const std::logic_error&) {
            refused = true;
        }
    }).join();
    CHECK(refused);
    CHECK(backup_flag(rollout, pc));

    // A write meant for another generation is dropped; the owner's write lands.
    rollout.write_steps({{running->number + 1, pc, false}});
    CHECK(backup_flag(rollout, pc));
    rollout.write_steps(writes);
    CHECK_FALSE(backup_flag(rollout, pc));
    rollout.release_links(true);
}

TEST_CASE(
    "rollout: an agent restarted under its pinned links moves them onto its own compiled "
    "entries",
    "[bpf][rollout]") {
    test::PinRoot pins;
    TempDir policies, state;
    auto policy = [&](const char* dst) {
        std::ofstream(policies.path + "/p.yaml")
            << "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n"
               "  attach: {hooks: [xdp], interfaces: [lo]}\n  priority: 100\n  select:\n"
               "    - dst: "
            << dst << "\n  actions:\n    - drop: {}\n";
    };
    // In a private network namespace (gone with this thread), on its lo. Catch's assertions
    // stay on the main thread: the thread writes down what it saw.
    std::string failure, before, adopted, after, wiped;
    std::thread([&] {
        try {
            if (unshare(CLONE_NEWNET) != 0) throw std::runtime_error("unshare(CLONE_NEWNET)");
            const auto cfg = config_of(policies, state, pins, {"lo"});
            auto maps = datapath::StateMaps::open(pins.path());
            {
                agent::Rollout first(cfg, maps);
                policy("192.0.2.7");
                auto o = first.apply(agent::snapshot(policies.path));
                if (!o.applied()) throw std::runtime_error("first apply: " + o.message);
                first.compile_entries();
                before = xdp_program("lo");
                first.release_links(false);  // the agent exits; its links stay pinned
            }
            // The next agent adopts the generation and the link (which runs the first agent's
            // compiled entry), then applies a new revision.
            {
                agent::Rollout second(cfg, maps);
                if (!second.adopt()) throw std::runtime_error("nothing adopted");
                adopted = xdp_program("lo");
                policy("192.0.2.8");
                auto o = second.apply(agent::snapshot(policies.path));
                if (!o.applied()) throw std::runtime_error("second apply: " + o.message);
                second.compile_entries();
                after = xdp_program("lo");
                second.release_links(false);
            }
            // The state directory wiped under the pins: the link is adopted all the same.
            std::filesystem::remove_all(state.path + "/state");
            agent::Rollout third(cfg, maps);
            if (third.adopt()) throw std::runtime_error("a generation adopted without a record");
            policy("192.0.2.9");
            auto o = third.apply(agent::snapshot(policies.path));
            if (!o.applied()) throw std::runtime_error("apply after the wipe: " + o.message);
            third.compile_entries();
            wiped = xdp_program("lo");
            third.release_links(true);
        } catch (const std::exception& e) {
            failure = e.what();
        }
    }).join();
    INFO(failure);
    REQUIRE(failure.empty());
    CHECK(before.rfind("fast_xdp#", 0) == 0);
    CHECK(adopted == before);
    CHECK(after.rfind("fast_xdp#", 0) == 0);
    CHECK(after != before);
    CHECK(wiped.rfind("fast_xdp#", 0) == 0);
    CHECK(wiped != after);
}

TEST_CASE(
    "rollout: a revision over a datapath limit is refused at the line to edit, before any "
    "load",
    "[bpf][rollout]") {
    test::PinRoot pins;
    TempDir policies, state;
    fs::copy_file(
        fs::path(MPS_SOURCE_DIR) / "tests/unit/manifests/invalid/87-programs-per-path.yaml",
        policies.path + "/limits.yaml");
    const auto cfg = config_of(policies, state, pins, {"mps-absent0"});
    auto maps = datapath::StateMaps::open(pins.path());
    agent::Rollout rollout(cfg, maps);
    auto outcome = rollout.apply(agent::snapshot(policies.path));
    INFO(outcome.message);
    CHECK(outcome.failure == agent::Stall::validation_failed);
    REQUIRE(outcome.errors.size() == 1);
    CHECK(outcome.errors.front().rfind("limits.yaml:8:13: error: /spec/priority: on hook 'xdp'",
                                       0) == 0);
    CHECK_FALSE(rollout.running_generation());
}

TEST_CASE("rollout: a policy naming an interface outside --interfaces attaches nothing there",
          "[bpf][rollout]") {
    test::PinRoot pins;
    TempDir policies, state;
    std::ofstream(policies.path + "/lo.yaml")
        << "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: on-lo}\nspec:\n"
           "  attach: {interfaces: [lo], hooks: [tc_egress]}\n  priority: 100\n"
           "  actions:\n    - record: {}\n";
    const auto cfg =
        config_of(policies, state, pins, {"mps-absent0"});  // the operator manages this one only
    auto maps = datapath::StateMaps::open(pins.path());
    agent::Rollout rollout(cfg, maps);
    auto outcome = rollout.apply(agent::snapshot(policies.path));
    INFO(outcome.message);
    REQUIRE(outcome.applied());
    CHECK(rollout.report().links.empty());
    REQUIRE(outcome.warnings.size() == 1);
    CHECK(outcome.warnings.front().find("interface 'lo' (tc_egress) is named by a policy but not "
                                        "managed by this agent") != std::string::npos);
    rollout.release_links(true);
}

TEST_CASE("state tables: sized when created, kept at their size when adopted, memory reported",
          "[bpf][rollout]") {
    test::PinRoot pins;
    datapath::TableSizes small;
    small.flows = 4096;
    std::map<std::string, datapath::TableInfo> first;
    {
        auto maps = datapath::StateMaps::open(pins.path(), small);
        for (const auto& t : maps.tables()) first[t.name] = t;
        CHECK(maps.sizes().flows == 4096);
    }
    CHECK(first.at("flows").capacity == 4096);
    CHECK(first.at("conns").capacity == small.conns());
    CHECK(first.at("announces").capacity == small.announces());
    CHECK(first.at("prio_sent").capacity == small.prio_sent());
    CHECK(first.at("events").capacity == MPS_EVENTS_BYTES);
    // at least the entries themselves (key + value per entry)
    CHECK(first.at("flows").memory_bytes >= 4096ull * (sizeof(mps_flow_key) + sizeof(mps_flow)));
    CHECK(first.at("conns").memory_bytes > 0);

    // A restart asking for more keeps the live tables (and their flows) at their size.
    datapath::TableSizes big;
    big.flows = 65536;
    auto maps = datapath::StateMaps::open(pins.path(), big);
    CHECK(maps.sizes().flows == 4096);
    for (const auto& t : maps.tables()) CHECK(t.capacity == first.at(t.name).capacity);
    // The datapath loads against them, and the rollout's status reports them.
    TempDir policies, state;
    agent::Config cfg;
    cfg.policies_dir = policies.path;
    cfg.state_dir = state.path;
    cfg.pin_root = pins.path();
    agent::Rollout rollout(cfg, maps);
    const auto report = rollout.report();
    REQUIRE(report.tables.size() == first.size());
    for (const auto& t : report.tables) CHECK(t.memory_bytes == first.at(t.name).memory_bytes);

    datapath::TableSizes wrong;
    wrong.flows = datapath::TableSizes::kMaxFlows + 1;
    test::PinRoot other;
    CHECK_THROWS_WITH(datapath::StateMaps::open(other.path(), wrong),
                      Catch::Contains("flow table size 2097153 outside 1024..2097152"));
    wrong.flows = 10;
    CHECK_THROWS_WITH(datapath::StateMaps::open(other.path(), wrong),
                      Catch::Contains("outside 1024.."));
}

TEST_CASE("state tables: a previous-layout pin of another shape is never read, only left",
          "[bpf][rollout]") {
    // Anything root put at the old layout's name: a hash table whose values are smaller than
    // that layout's flows, holding an entry (read with the old stride it would overrun).
    test::PinRoot pins;
    const std::string maps_dir = pins.path() + "/maps";
    std::filesystem::create_directories(maps_dir);
    const std::string old_pin = maps_dir + "/flows_v" + std::to_string(MPS_STATE_LAYOUT - 1);
    int fd = bpf_map_create(BPF_MAP_TYPE_HASH, "flows", sizeof(mps_flow_key), 8, 16, nullptr);
    REQUIRE(fd >= 0);
    mps_flow_key key{};
    key.family = 4;
    uint64_t value = 42;
    REQUIRE(bpf_map_update_elem(fd, &key, &value, BPF_ANY) == 0);
    REQUIRE(bpf_obj_pin(fd, old_pin.c_str()) == 0);
    close(fd);

    auto maps = datapath::StateMaps::open(pins.path());
    mps_flow f{};
    CHECK(bpf_map_lookup_elem(maps.flows(), &key, &f) != 0);  // nothing carried over
    CHECK(std::filesystem::exists(old_pin));                  // and nothing removed
}

TEST_CASE("state tables: an upgrade carries the previous layout's flows and connections over",
          "[bpf][rollout]") {
    // What an agent of layout 3 left pinned: flows of 184 bytes (this layout without
    // rate_limit's edges at its end), one linked to a connection and one not.
    static_assert(MPS_STATE_LAYOUT == 4, "this test pins the layout before this one");
    test::PinRoot pins;
    const std::string maps_dir = pins.path() + "/maps";
    std::filesystem::create_directories(maps_dir);
    auto pinned = [&](const char* name, bpf_map_type type, uint32_t key, uint32_t value) {
        int fd = bpf_map_create(type, name, key, value, 1024, nullptr);
        REQUIRE(fd >= 0);
        REQUIRE(bpf_obj_pin(fd, (maps_dir + "/" + name + "_v3").c_str()) == 0);
        return fd;
    };
    int old_flows = pinned("flows", BPF_MAP_TYPE_LRU_HASH, sizeof(mps_flow_key), 184);
    int old_conns = pinned("conns", BPF_MAP_TYPE_LRU_HASH, sizeof(__u32), sizeof(mps_conn));
    mps_flow_key linked{}, unlinked{};
    linked.a[0] = unlinked.a[0] = 0x0100000a;
    linked.b[0] = unlinked.b[0] = 0x0200000a;
    linked.port_a = 40000;
    unlinked.port_a = 40001;
    linked.port_b = unlinked.port_b = 443;
    linked.family = unlinked.family = 4;
    uint8_t v3[184] = {};
    auto put = [&](size_t off, auto value) { std::memcpy(v3 + off, &value, sizeof value); };
    put(0, uint64_t{7});                    // dir_ab.packets
    put(8, uint64_t{100});                  // dir_ab.bytes
    put(128, uint64_t{3});                  // dir_ba.packets
    put(128 + 8, uint64_t{5000});           // dir_ba.bytes
    put(128 + 16, uint32_t{900});           // dir_ba.isn
    put(88, uint64_t{0x1122334455667788});  // key[0]
    put(124, uint32_t{0xabcdef01});         // token[1]
    put(52, uint32_t{21000});               // srtt_us
    put(64, uint64_t{125000});              // rate_bps
    put(72, uint8_t{MPS_ROLE_JOIN});        // role
    REQUIRE(bpf_map_update_elem(old_flows, &unlinked, v3, BPF_ANY) == 0);
    put(48, uint32_t{0x01020304});  // conn_token
    put(168, uint64_t{8});          // conn_packets: what the connection holds of its counts
    put(176, uint64_t{4100});       // conn_bytes
    REQUIRE(bpf_map_update_elem(old_flows, &linked, v3, BPF_ANY) == 0);
    __u32 token = 0x01020304;
    mps_conn conn{};
    conn.bytes = 123456;
    conn.subflows = 2;
    REQUIRE(bpf_map_update_elem(old_conns, &token, &conn, BPF_ANY) == 0);
    close(old_flows);
    close(old_conns);

    auto maps = datapath::StateMaps::open(pins.path());
    for (const auto* key : {&linked, &unlinked}) {
        const bool is_linked = key == &linked;
        INFO((is_linked ? "linked" : "unlinked"));
        mps_flow f{};
        REQUIRE(bpf_map_lookup_elem(maps.flows(), key, &f) == 0);
        CHECK(f.dir_ab.packets == 7);
        CHECK(f.dir_ba.bytes == 5000);
        CHECK(f.dir_ba.isn == 900);
        CHECK(f.key[0] == 0x1122334455667788ull);
        CHECK(f.token[1] == 0xabcdef01u);
        CHECK(f.conn_token == (is_linked ? 0x01020304u : 0u));
        CHECK(f.srtt_us == 21000u);
        CHECK(f.rate_bps == 125000u);
        CHECK(f.role == MPS_ROLE_JOIN);
        CHECK(f.conn_packets == (is_linked ? 8u : 0u));
        CHECK(f.conn_bytes == (is_linked ? 4100u : 0u));
        // rate_limit's edges start unset: its first ACK gets a full bucket.
        CHECK(f.rate_edge_ns[0] == 0);
        CHECK(f.rate_edge_ns[1] == 0);
        CHECK(f.rate_edge[0] == 0);
        CHECK(f.rate_most[1] == 0);
    }
    mps_conn c{};
    REQUIRE(bpf_map_lookup_elem(maps.conns(), &token, &c) == 0);
    CHECK(c.bytes == 123456u);
    CHECK(c.subflows == 2u);
    // The old pins are gone; the programs still holding them keep their own references.
    CHECK_FALSE(std::filesystem::exists(maps_dir + "/flows_v3"));
    CHECK_FALSE(std::filesystem::exists(maps_dir + "/conns_v3"));
    CHECK(std::filesystem::exists(maps_dir + "/flows_v" + std::to_string(MPS_STATE_LAYOUT)));
}

TEST_CASE("state tables: the agent reads a connection with what its flows have not handed over",
          "[bpf][rollout]") {
    // The datapath adds a flow's counts to its connection once per tick: the entry alone lags.
    test::PinRoot pins;
    auto maps = datapath::StateMaps::open(pins.path());
    const uint32_t tok = 0x00c0ffee;
    mps_conn c{};
    c.token[0] = tok;
    c.token[1] = tok + 1;
    c.bytes = 1000;  // what both subflows handed over, and a closed third one before them
    c.packets = 10;
    REQUIRE(bpf_map_update_elem(maps.conns(), &tok, &c, BPF_ANY) == 0);
    auto flow = [&](uint16_t port, uint32_t conn_token, uint64_t bytes, uint64_t held) {
        mps_flow_key k{};
        k.a[0] = 0x0100000a;
        k.b[0] = 0x0200000a;
        k.port_a = port;
        k.port_b = 443;
        k.family = 4;
        mps_flow f{};
        f.conn_token = conn_token;
        f.dir_ab.bytes = bytes - bytes / 4;
        f.dir_ba.bytes = bytes / 4;
        f.dir_ab.packets = bytes / 100;
        f.conn_bytes = held;
        f.conn_packets = held / 100;
        REQUIRE(bpf_map_update_elem(maps.flows(), &k, &f, BPF_ANY) == 0);
    };
    flow(40000, tok, 600, 400);  // 200 not handed over yet
    flow(40001, tok, 300, 300);  // all handed over
    flow(40002, 0, 5000, 0);     // another connection's, unlinked
    lua::FlowIds ids;
    lua::StepWriteQueue queue;
    lua::DatapathBackend backend(maps, ids, queue);
    auto conn = backend.connection(tok);
    REQUIRE(conn);
    CHECK(conn->bytes == 1200);
    CHECK(conn->packets == 12);
    CHECK(conn->subflows.size() == 2);
}
