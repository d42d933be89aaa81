// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The semantic checks' shared state (not a public header): Checker turns schema-valid
// documents into model pieces (steps.cpp: selectors and actions; policy.cpp: host facts and
// one policy), Resolver inlines selector sets and action chains (resolve.cpp), and load_docs
// (model.cpp) runs the checks that need several documents.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "manifest/internal.h"

namespace mpsteer::manifest::detail {

std::string fmt_pos(const Position& p);  // "FILE:LINE:COL"

// A Policy, SelectorSet, ActionChain or Balancer by name.
struct Named {
    const Doc* doc = nullptr;
    bool valid = false;  // passed the schema
    bool used = false;
};

struct Checker {
    const Options& opts;
    std::vector<Diagnostic>& diags;

    void error(const Doc& d, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::error, d.at(ptr), ptr.empty() ? "/" : ptr, std::move(msg)});
    }
    void error_at(const Position& p, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::error, p, ptr.empty() ? "/" : ptr, std::move(msg)});
    }
    void warning(const Doc& d, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::warning, d.at(ptr), ptr.empty() ? "/" : ptr, std::move(msg)});
    }

    // Parameters (steps.cpp).
    std::optional<IpAddr> address(const Doc& d, const std::string& ptr, const std::string& s);
    bool cidr(const Doc& d, const std::string& ptr, const std::string& s, Selector& out);
    bool port_range(const Doc& d, const std::string& ptr, const nlohmann::json& v, uint16_t& lo,
                    uint16_t& hi);
    // A value or an inclusive range "LO-HI" of a header field up to max (what: its name).
    bool field_range(const Doc& d, const std::string& ptr, const nlohmann::json& v, unsigned max,
                     const char* what, unsigned& lo, unsigned& hi);
    std::optional<uint64_t> size(const Doc& d, const std::string& ptr, const nlohmann::json& v);
    std::optional<uint64_t> duration(const Doc& d, const std::string& ptr, const std::string& s,
                                     uint64_t min_us, uint64_t max_us, const char* range);

    // Selectors and actions of one document (steps.cpp).
    std::optional<Selector> selector(const Doc& d, const std::string& ptr,
                                     const nlohmann::json& item);
    std::optional<std::vector<Selector>> selectors(const Doc& d, const std::string& ptr);
    std::optional<Action> action(const Doc& d, const std::string& ptr, const nlohmann::json& item);
    std::optional<std::vector<Action>> actions(const Doc& d, const std::string& ptr);

    // Host facts (policy.cpp).
    std::optional<std::set<std::string>> interfaces_cache;
    bool interfaces_loaded = false;
    const std::optional<std::set<std::string>>& known_interfaces();
    void check_interface(const Doc& d, const std::string& ptr, const std::string& name);

    // One policy (policy.cpp).
    std::optional<Policy> policy(const Doc& d);
    // The balancer (balancer.cpp).
    std::optional<Balancer> balancer(const Doc& d);
};

// Inlines selector_set and action_chain references; false (with a diagnostic) on an unknown
// name or a cycle (resolve.cpp).
struct Resolver {
    Checker& ck;
    std::map<std::string, Named>& set_names;
    std::map<std::string, Named>& chain_names;
    std::map<std::string, std::optional<std::vector<Selector>>>& sets;
    std::map<std::string, std::optional<std::vector<Action>>>& chains;

    std::string suggest(const std::string& name, const std::map<std::string, Named>& names);
    bool selector(Selector& s, std::vector<std::string>& stack);
    bool actions(std::vector<Action>& list, std::vector<std::string>& stack);
};

}  // namespace mpsteer::manifest::detail
