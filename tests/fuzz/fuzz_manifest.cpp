// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// libFuzzer target: arbitrary bytes through the whole loader (YAML parse, typed JSON, schema
// validation, semantic checks) and, when valid, the compiler and the plan model round trip.
// Built and run by tests/fuzz/run.sh, not by the default build.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "compile/compile.h"
#include "manifest/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace mpsteer;
    std::string text(reinterpret_cast<const char*>(data), size);
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{"lo", "eth0", "eth1"};
    o.check_scripts = false;  // keep the target free of file system lookups
    auto r = manifest::load_sources({{"fuzz.yaml", text}}, o);
    // Messages quote the input: they must stay printable as JSON (valid UTF-8).
    nlohmann::json all = nlohmann::json::array();
    for (const auto& d : r.diagnostics) all.push_back(d.format());
    (void)all.dump();
    if (!r.ok()) return 0;
    // What `mpsteer validate` reports about the datapath's limits is what the compiler
    // enforces: a model it passes must compile.
    if (!compile::check_limits(r.model).empty()) return 0;
    try {
        auto out = compile::compile(r.model);
        auto plan = compile::make_plan_model(r.model, out);
        auto back = compile::plan_model_from_json(compile::to_json(plan));
        if (back.chains.serialize() != out.chains.serialize()) __builtin_trap();
        (void)compile::to_text(compile::diff({}, plan));
    } catch (const compile::Error&) {
        __builtin_trap();  // a limit the validator missed
    }
    return 0;
}
