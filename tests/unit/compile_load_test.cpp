// The compiler's output feeds the datapath loader: every shipped policy and the valid
// examples compile into a ChainSet that Generation::build loads and verifies. Needs root and
// BPF (label bpf); pins under a private bpffs directory removed afterwards.
#include <unistd.h>

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

datapath::ChainSet compiled(const std::string& dir) {
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{"lo", "eth0", "eth1", "eth2"};
    o.check_scripts = false;
    auto r = manifest::load_paths({(fs::path(MPS_SOURCE_DIR) / dir).string()}, o);
    for (const auto& d : r.diagnostics) INFO(d.format());
    REQUIRE(r.ok());
    return compile::compile(r.model).chains;
}
}  // namespace

TEST_CASE("compiled policies load as a generation", "[bpf][compile]") {
    datapath::init_libbpf_logging();
    PinRoot pins;
    datapath::ensure_bpffs("/sys/fs/bpf");
    auto state = datapath::StateMaps::open(pins.path);
    uint32_t number = 1;
    for (const char* dir : {"policies", "tests/unit/manifests/valid"}) {
        INFO(dir);
        auto chains = compiled(dir);
        REQUIRE(chains.check().empty());
        auto gen = datapath::Generation::build(chains, number++, state);
        REQUIRE(gen);
        CHECK(gen->chains().serialize() == chains.serialize());
        CHECK(gen->entry_fd(datapath::Hook::xdp) >= 0);
    }
}
