// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Manifests: YAML documents (Policy, SelectorSet, ActionChain) loaded from files, converted to
// typed JSON, validated against the JSON Schemas in schemas/ (embedded at build time), checked
// for meaning (references, ranges, conflicts) and turned into a typed model with every
// reference inlined. Nothing here touches the kernel; the compiler (src/compile) takes the model.
// Problems are reported as Diagnostics, never thrown; the format is documented in
// schemas/README.md.
#pragma once

#include "net/hook.h"

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpsteer::manifest {

// 1-based line and column, as editors and compilers print them.
struct Position {
    std::string file;
    int line = 0;
    int col = 0;
    auto operator<=>(const Position&) const = default;
};

enum class Severity { error, warning };

struct Diagnostic {
    Severity severity = Severity::error;
    Position pos;
    std::string pointer;  // JSON pointer into the document ("" for the document itself)
    std::string message;
    // "FILE:LINE:COL: error: /json/pointer: message"
    std::string format() const;
};
// Sorts by file, line, column, severity, message; removes exact duplicates.
void sort_diagnostics(std::vector<Diagnostic>& d);

struct IpAddr {
    uint8_t family = 0;               // 4 or 6
    std::array<uint8_t, 16> bytes{};  // network order; IPv4 uses the first 4
    auto operator<=>(const IpAddr&) const = default;
};
std::string to_string(const IpAddr& a);

enum class PortDir : uint8_t { src, dst, either };
enum class SeqKind : uint8_t { subflow, data };
enum class BytesScope : uint8_t { subflow, connection };

struct Selector {
    enum class Kind : uint8_t {
        subflow,
        ip_pair,
        src,
        dst,
        port,
        packet_type,
        ttl,   // IPv4 TTL, IPv6 hop limit
        dscp,  // the DSCP of the IPv4 TOS / IPv6 traffic class
        token,
        sequence,
        flow_bytes,
        any,   // children: OR
        all,   // children: AND (an included selector set)
        not_,  // one child
        ref,   // `selector_set: NAME` before inlining; never in a Model
    };
    Kind kind = Kind::src;
    Position pos;         // of the selector's key, in the file that defines it
    std::string pointer;  // JSON pointer of that key in its document
    IpAddr addr;          // src, dst (already masked)
    uint8_t prefix = 0;
    IpAddr a, b;                      // ip_pair, subflow
    uint16_t port_a = 0, port_b = 0;  // subflow
    PortDir dir = PortDir::either;    // port
    uint16_t port_lo = 0, port_hi = 0;
    uint8_t ip_lo = 0, ip_hi = 0;           // ttl, dscp: inclusive
    std::vector<std::string> packet_types;  // packet_type, names as in the schema
    uint32_t token = 0;
    SeqKind seq_kind = SeqKind::subflow;
    BytesScope scope = BytesScope::subflow;
    uint64_t lo = 0, hi = UINT64_MAX;  // sequence, flow_bytes: [lo, hi)
    std::vector<Selector> children;    // any, all; not: exactly one
    std::string ref;                   // ref: the selector set's name
    // Number of selector programs this expands to (leaves).
    size_t leaves() const;
    std::string describe() const;  // "dst 10.0.1.0/24", "any(port dst 80, port dst 443)"
};

// The actions, by their manifest key; each one's program is act_<key> in MPS_PROGRAMS (abi.h).
#define MPS_ACTION_KINDS(X) \
    X(pass)                 \
    X(drop)                 \
    X(record)               \
    X(get_connect)          \
    X(get_subflow)          \
    X(rate_limit)           \
    X(blk_subflow)          \
    X(add_subflow)          \
    X(set_backup)           \
    X(no_subflows)          \
    X(redirect)             \
    X(reject)

struct Action {
    enum class Kind : uint8_t {
#define MPS_ACTION_ENUM(k) k,
        MPS_ACTION_KINDS(MPS_ACTION_ENUM)
#undef MPS_ACTION_ENUM
            ref,  // `action_chain: NAME` before inlining; never in a Model
    };
    Kind kind = Kind::pass;
    Position pos;                     // of the action's key, in the file that defines it
    std::string pointer;              // JSON pointer of that key in its document
    uint64_t rate_bytes_per_sec = 0;  // rate_limit
    uint32_t rtt_us = 0;
    uint32_t min_window = 0;
    bool backup = true;  // set_backup
    bool once = true;
    std::optional<uint64_t> after_bytes;  // add_subflow: re-inject on its own past this count
    std::string interface;                // redirect
    std::vector<std::string> metrics;     // record (informational)
    std::string ref;                      // ref: the action chain's name
    // For an action brought in by `action_chain: NAME`: that entry in the policy (the
    // outermost one for nested chains) and NAME. A problem that depends on the policy (its
    // hooks, what runs before) is reported there, with `pos` as a note.
    Position via_pos;
    std::string via_pointer;
    std::string via_chain;
    std::string describe() const;
};
std::string_view to_string(Action::Kind k);  // its manifest key
std::optional<Action::Kind> action_kind(std::string_view key);
// Where an actor may run (documented in schemas/README.md): the one table of the hooks each
// action accepts, read by the check and by its hint. Sorted; every hook when unrestricted.
std::vector<Hook> allowed_hooks(Action::Kind k);
bool applicable(Action::Kind k, Hook h);  // h is in allowed_hooks(k)
// pass, drop and reject: nothing after them runs.
bool ends_chain(Action::Kind k);

struct LuaHook {
    std::string script;          // as written (relative to the repository)
    std::string path;            // the file found on disk
    std::string source;          // its bytes, read beneath the repository with the manifests
    uint32_t every_ms = 0;       // 0: no on_tick
    uint32_t idle_every_ms = 0;  // 0: every_ms also without connections
    nlohmann::json params = nlohmann::json::object();
};

enum class FailureMode : uint8_t { pass, drop };

struct Policy {
    std::string name;
    Position pos;                         // the document
    Position attach_pos, priority_pos;    // of `attach` and `priority` (the datapath's limits)
    std::vector<std::string> interfaces;  // sorted; empty: every managed interface
    std::vector<Hook> hooks;              // sorted
    uint32_t priority = 0;
    FailureMode failure_mode = FailureMode::pass;
    bool cont = false;             // `continue: true`
    std::vector<Selector> select;  // AND; selector sets inlined
    std::vector<Action> actions;   // action chains inlined
    std::optional<LuaHook> lua;
    // The resolved policy as canonical JSON (references inlined, defaults filled): two
    // revisions of a policy are "the same" when this text is.
    std::string canonical;
    // Longest run of steps through the policy: selectors + actions.
    size_t steps() const;
};

// The load balancer (kind: Balancer; bpf/lb.bpf.c): what the agent runs beside the policies.
struct Balancer {
    struct Service {
        IpAddr vip;
        uint16_t port = 0;
        auto operator<=>(const Service&) const = default;
    };
    struct Backend {
        std::string name;
        std::array<uint8_t, 6> mac{};
        std::string interface;  // this host's, towards the backend
        uint32_t weight = 1;
        bool draining = false;
        bool operator==(const Backend&) const = default;
    };
    std::string name;
    Position pos;                         // the document
    std::vector<std::string> interfaces;  // sorted: the clients' side, XDP
    std::vector<Service> services;        // one per VIP and port, sorted
    std::vector<Backend> backends;        // as written
    bool reset_unknown_tokens = false;    // `unknown_token: reset`
    uint32_t subflow_table = 65536;
    uint32_t token_table = 65536;
    bool operator==(const Balancer&) const = default;
};

struct Model {
    std::vector<Policy> policies;      // sorted by name
    std::optional<Balancer> balancer;  // at most one per revision
};

struct Options {
    // Interfaces that exist; names outside it give a warning. nullopt: read /sys/class/net.
    std::optional<std::set<std::string>> known_interfaces;
    // The repository root: scripts are looked up and read beneath it, from the manifest's
    // directory up. Empty: the nearest directory above the manifest with a .git entry, else
    // the directory given to load_paths (the manifest's own for load_sources).
    std::string repo_root;
    // Skip the script-exists check (fuzzing, or validating a manifest away from its repo).
    bool check_scripts = true;
};

struct Result {
    Model model;
    std::vector<Diagnostic> diagnostics;  // sorted
    std::vector<std::string> files;       // files read, sorted
    bool ok() const;                      // no error (warnings allowed)
};

// Files and directories (recursively: *.yaml, *.yml; hidden entries skipped). A path that
// does not exist is an error diagnostic.
Result load_paths(const std::vector<std::string>& paths, const Options& opts = {});
// In-memory sources (tests, fuzzing): {file name, text}. The name is used in positions and
// to find scripts.
Result load_sources(const std::vector<std::pair<std::string, std::string>>& sources,
                    const Options& opts = {});

// Number parsers shared with the CLI and tests; nullopt when malformed or out of range.
std::optional<uint64_t> parse_duration_us(std::string_view s);         // "100ms" -> 100000
std::optional<uint64_t> parse_rate_bytes_per_sec(std::string_view s);  // "20Mbit" -> 2500000
std::optional<IpAddr> parse_ip(std::string_view s);

}  // namespace mpsteer::manifest
