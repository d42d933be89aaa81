// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// One policy document into the model (attachment, priority, selectors, actions, Lua hook),
// with the facts of this host it depends on: which interfaces exist, where scripts are.
#include <algorithm>
#include <filesystem>

#include "manifest/checker.h"

namespace mpsteer::manifest::detail {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {
constexpr uint64_t kMinEvery = 10'000, kMaxEvery = 3'600'000'000;  // 10 ms .. 1 h
}  // namespace

const std::optional<std::set<std::string>>& Checker::known_interfaces() {
    if (!interfaces_loaded) {
        interfaces_loaded = true;
        if (opts.known_interfaces) {
            interfaces_cache = opts.known_interfaces;
        } else {
            std::error_code ec;
            std::set<std::string> names;
            for (fs::directory_iterator it("/sys/class/net", ec), end; !ec && it != end;
                 it.increment(ec))
                names.insert(it->path().filename().string());
            if (!ec && !names.empty()) interfaces_cache = std::move(names);
        }
    }
    return interfaces_cache;
}
void Checker::check_interface(const Doc& d, const std::string& ptr, const std::string& name) {
    // The rest of Linux's dev_valid_name (1-15 bytes, no '/', ':' or whitespace) is the
    // schema's pattern, which counts bytes.
    if (name == "." || name == "..") {
        error(d, ptr, "'" + name + "' is not a valid interface name (Linux refuses '.' and '..')");
        return;
    }
    if (name.find('\0') != std::string::npos) {
        error(d, ptr, "interface name contains a NUL character");
        return;
    }
    const auto& known = known_interfaces();
    if (known && !known->count(name)) {
        std::string msg = "interface '" + name + "' does not exist on this host";
        std::string near = closest(name, {known->begin(), known->end()});
        if (!near.empty()) msg += "; did you mean '" + near + "'?";
        warning(d, ptr, msg);
    }
}

// ---- one policy ---------------------------------------------------------------------

std::optional<Policy> Checker::policy(const Doc& d) {
    const json& spec = d.json["spec"];
    Policy p;
    p.name = d.json["metadata"]["name"];
    p.pos = d.root;
    p.attach_pos = d.at("/spec/attach");
    p.priority_pos = d.at("/spec/priority");
    bool ok = true;
    const json& attach = spec["attach"];
    if (attach.contains("interfaces")) {
        for (size_t i = 0; i < attach["interfaces"].size(); ++i) {
            std::string name = attach["interfaces"][i];
            check_interface(d, pointer_join("/spec/attach/interfaces", i), name);
            p.interfaces.push_back(name);
        }
    }
    std::sort(p.interfaces.begin(), p.interfaces.end());
    for (const auto& h : attach["hooks"])  // the schema admits only the hooks' names
        p.hooks.push_back(hook_from_string(h.get<std::string>()).value_or(Hook::tc_ingress));
    std::sort(p.hooks.begin(), p.hooks.end());
    p.priority = spec["priority"].get<uint32_t>();
    if (spec.contains("failure_mode") && spec["failure_mode"] == "drop")
        p.failure_mode = FailureMode::drop;
    if (spec.contains("continue")) p.cont = spec["continue"];
    if (spec.contains("select")) {
        auto s = selectors(d, "/spec/select");
        if (s)
            p.select = std::move(*s);
        else
            ok = false;
    }
    auto a = actions(d, "/spec/actions");
    if (a)
        p.actions = std::move(*a);
    else
        ok = false;
    if (spec.contains("hooks")) {
        const json& h = spec["hooks"];
        LuaHook lua;
        lua.script = h["script"];  // found and read by load_docs
        if (h.contains("every")) {
            auto us =
                duration(d, "/spec/hooks/every", h["every"], kMinEvery, kMaxEvery, "10ms to 1h");
            if (!us)
                ok = false;
            else if (*us % 1000) {
                error(d, "/spec/hooks/every", "must be a whole number of milliseconds");
                ok = false;
            } else {
                lua.every_ms = uint32_t(*us / 1000);
            }
        }
        if (h.contains("idle_every")) {
            auto us = duration(d, "/spec/hooks/idle_every", h["idle_every"], kMinEvery, kMaxEvery,
                               "10ms to 1h");
            if (!us) {
                ok = false;
            } else if (*us % 1000) {
                error(d, "/spec/hooks/idle_every", "must be a whole number of milliseconds");
                ok = false;
            } else if (!lua.every_ms || *us / 1000 < lua.every_ms) {
                error(d, "/spec/hooks/idle_every",
                      lua.every_ms
                          ? "must be at least every (" + std::to_string(lua.every_ms) + "ms)"
                          : "needs every: without ticks there is nothing to slow down");
                ok = false;
            } else {
                lua.idle_every_ms = uint32_t(*us / 1000);
            }
        }
        if (h.contains("params")) lua.params = h["params"];
        p.lua = std::move(lua);
    }
    if (!ok) return std::nullopt;
    return p;
}
}  // namespace mpsteer::manifest::detail
