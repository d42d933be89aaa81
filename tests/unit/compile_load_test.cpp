// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The compiler's output feeds the datapath loader: every shipped policy and the valid
// examples compile into a ChainSet that Generation::build loads and verifies. Needs root and
// BPF (label bpf); runs in a network namespace of its own where the interfaces the policies
// name (redirect targets) exist (veth pairs); pins under a private bpffs directory removed
// afterwards.
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include <filesystem>
#include <set>

#include <catch2/catch.hpp>

#include "compile/compile.h"
#include "datapath/datapath.h"

using namespace mpsteer;
namespace fs = std::filesystem;

namespace {
struct PinRoot {
    std::string path = "/sys/fs/bpf/mpsteer-test-" + std::to_string(getpid());
    ~PinRoot() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// The loader resolves the interfaces the chains name: create them in a namespace of our own.
void own_netns() {
    REQUIRE(unshare(CLONE_NEWNET) == 0);
    REQUIRE(std::system("for i in eth0 eth1 eth2 wwan0; do "
                        "ip link add $i type veth peer name $i-peer || exit 1; "
                        "ip link set $i up; done") == 0);
}

datapath::ChainSet compiled(const std::vector<std::pair<std::string, std::string>>& sources) {
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{"lo", "eth0", "eth1", "eth2", "wwan0"};
    o.check_scripts = false;
    auto r = manifest::load_sources(sources, o);
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    auto chains = compile::compile(r.model).chains;
    REQUIRE(chains.check().empty());
    return chains;
}

datapath::ChainSet compiled(const std::string& dir) {
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{"lo", "eth0", "eth1", "eth2", "wwan0"};
    o.check_scripts = false;
    auto r = manifest::load_paths({(fs::path(MPS_SOURCE_DIR) / dir).string()}, o);
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    auto chains = compile::compile(r.model).chains;
    REQUIRE(chains.check().empty());
    return chains;
}

// Every selector, composition, per-interface entries, continue and failure modes, with the
// actors the datapath implements today.
const char* kImplemented = R"(apiVersion: mpsteer.dev/v1
kind: SelectorSet
metadata: {name: web}
spec:
  select:
    - dst: 10.0.1.0/24
    - port: {dst: 443}
---
apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: observe}
spec:
  attach: {hooks: [xdp, tc_egress, tc_ingress]}
  priority: 1
  continue: true
  select:
    - packet_type: [mp_capable, mp_join]
  actions:
    - get_connect: {}
    - get_subflow: {}
---
apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: selectors}
spec:
  attach: {interfaces: [eth1], hooks: [xdp, tc_egress]}
  priority: 2
  failure_mode: drop
  select:
    - selector_set: web
    - src: 2001:db8::/32
    - ip_pair: {a: 10.0.0.1, b: 10.0.0.2}
    - subflow: {a: {address: 10.0.0.1, port: 1}, b: {address: 10.0.0.2, port: 2}}
    - token: 0x01020304
    - sequence: {kind: subflow, to: 1000}
    - sequence: {kind: data, from: 1}
    - flow_bytes: {scope: connection, to: 1MB}
    - any:
        - port: {src: 80}
        - not: {port: {either: 8000-8100}}
  actions:
    - record: {}
    - rate_limit: {rate: 10Mbit, rtt: 10ms}
    - drop: {}
---
apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: rest}
spec:
  attach: {hooks: [xdp]}
  priority: 3
  actions:
    - pass: {}
)";
}  // namespace

TEST_CASE("compiled policies load as a generation", "[bpf][compile]") {
    datapath::init_libbpf_logging();
    own_netns();
    PinRoot pins;
    datapath::ensure_bpffs("/sys/fs/bpf");
    auto state = datapath::StateMaps::open(pins.path);
    auto chains = compiled({{"implemented.yaml", kImplemented}});
    CHECK(chains.entries.size() ==
          5);  // xdp "", xdp eth1, tc_egress "", tc_egress eth1, tc_ingress ""
    auto gen = datapath::Generation::build(chains, 1, state);
    REQUIRE(gen);
    CHECK(gen->chains().serialize() == chains.serialize());
    CHECK(gen->entry_fd(datapath::Hook::xdp) >= 0);
}

// The shipped policies and the valid examples, with the option-rewriting actors
// (blk_subflow, add_subflow, set_backup, no_subflows, redirect).
TEST_CASE("shipped policies load as a generation", "[bpf][compile]") {
    datapath::init_libbpf_logging();
    own_netns();
    PinRoot pins;
    datapath::ensure_bpffs("/sys/fs/bpf");
    auto state = datapath::StateMaps::open(pins.path);
    uint32_t number = 1;
    for (const char* dir : {"policies", "tests/unit/manifests/valid"}) {
        INFO(dir);
        auto chains = compiled(std::string(dir));
        auto gen = datapath::Generation::build(chains, number++, state);
        REQUIRE(gen);
        CHECK(gen->chains().serialize() == chains.serialize());
    }
}
