// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent as a child process against a Lab, for the agent's e2e tests and the apply-latency
// benchmark: revisions published the way git-sync does (a new directory revs/<hash>, then a
// symlink current.tmp -> revs/<hash> renamed over `current`), status.json read back, and
// random but valid (or deliberately invalid) policy sets on the lab's server interfaces.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lab/lab.h"

namespace mpsteer::agent_e2e {

using Files = std::map<std::string, std::string>;  // relative path -> text

// One revision of the policy directory.
struct RevisionSpec {
    Files files;
    bool valid = true;
    std::set<std::string> policies;  // names of the Policy documents (valid revisions)
    std::string broken;              // what is wrong with an invalid one
};

// Random policy sets on the lab: every policy selects by the lab's addresses or port 5201 and
// uses actors that leave the transfer alone (record, get_connect, get_subflow, rate_limit at
// 40 Gbit/s, pass; drop only on port 9, which no test sends to). `seq` makes every revision's
// content unique (a revision.txt the manifests loader ignores).
class PolicyGen {
public:
    PolicyGen(const lab::Lab& lab, uint64_t seed) : lab_(lab), rng_(seed) {}
    RevisionSpec valid(int seq);
    // A valid set plus one broken document (unknown action, host bits, YAML syntax, an action
    // after drop, a duplicate name, a bad rate), in turn.
    RevisionSpec invalid(int seq);
    std::mt19937_64& rng() { return rng_; }

private:
    std::string policy(const std::string& name, int slot);
    const lab::Lab& lab_;
    std::mt19937_64 rng_;
    int broken_kind_ = 0;
};

// The path of the built mpsteer binary (compile definition MPSTEER_BIN).
std::string mpsteer_bin();
// A file of the source tree (compile definition MPS_SOURCE_DIR), e.g. "lua/ecf.lua".
std::string source(const std::string& rel);
// A whole file ("" when it cannot be read).
std::string slurp(const std::string& path);
// A lab tagged `what` (at most 4 characters) and this process, after removing the labs of
// processes that are gone.
lab::LabConfig lab_config(const char* what);
// The wall clock in milliseconds since the epoch (the status document's timestamps).
int64_t unix_ms_now();
// The status's entry for the Lua hook of `policy` (status.json "lua_hooks"), or null.
const nlohmann::json* hook_of(const nlohmann::json& status, const std::string& policy);

class AgentHarness {
public:
    // Creates /tmp/mpsteer-<what>-<pid>/ (policies, state, logs) and the pin root
    // /sys/fs/bpf/mpsteer-<what>-<pid>.
    // The agent runs in the server's namespace on its interfaces, or with client_side in the
    // client's (policies that act on what the client receives, e.g. the small-flow manager).
    AgentHarness(const lab::Lab& lab, const std::string& what, int debounce_ms = 10,
                 bool client_side = false);
    // In any namespace, on these interfaces (none: every one but loopback, as `-i` absent).
    AgentHarness(std::string netns, std::vector<std::string> interfaces, const std::string& what,
                 int debounce_ms = 10);
    // Stops the agent (SIGTERM, then SIGKILL), `mpsteer reset`, removes the directories.
    ~AgentHarness();
    AgentHarness(const AgentHarness&) = delete;
    AgentHarness& operator=(const AgentHarness&) = delete;

    pid_t start();  // a new agent process; its output goes to logs/agent-<k>.log
    std::vector<std::string> extra_args;  // appended to `mpsteer run ...` by start()
    int metrics_port = 0;                 // start()'s --metrics-port (0: off)
    int output_fd = -1;  // start(): the agent's stdout and stderr (-1: logs/agent-<k>.log)
    void kill9();        // SIGKILL and reap
    // SIGTERM and reap (SIGKILL after 10 s); the wait status, -1 when no agent ran.
    int stop();
    pid_t pid() const { return pid_; }
    bool alive();  // still running (reaps it when not)
    int starts() const { return starts_; }

    // Publishes a revision; returns its id (the 40-hex directory name) and sets `published`
    // to the moment of the rename.
    std::string publish(const Files& files,
                        std::chrono::steady_clock::time_point* published = nullptr);

    // status.json, or null when absent or unreadable.
    nlohmann::json status() const;
    // Polls status.json every `every` until pred(status) holds for a status written by the
    // running agent; returns false on timeout.
    bool wait_status(const std::function<bool(const nlohmann::json&)>& pred,
                     std::chrono::milliseconds timeout,
                     std::chrono::milliseconds every = std::chrono::milliseconds(2));
    // Empty when state/applied.json equals what `mpsteer plan` compiles from revs/<id> (no
    // added, changed or removed policy, the same steps, revision == id); otherwise what differs.
    std::string applied_mismatch(const std::string& id) const;

    std::string log(int k) const;                     // the k-th run's output (1-based)
    std::string log_tail(size_t bytes = 4000) const;  // the current run's
    // Polls the current run's output until it holds `needle`; false on timeout.
    bool wait_log(const std::string& needle, std::chrono::milliseconds timeout) const;

    const std::string& dir() const { return dir_; }
    const std::string& state_dir() const { return state_; }
    const std::string& pin_root() const { return pins_; }

private:
    std::string netns_;
    std::vector<std::string> interfaces_;
    std::string dir_, state_, pins_;
    int debounce_ms_;
    pid_t pid_ = -1;
    int starts_ = 0;
    uint64_t rev_counter_ = 0;
};

}  // namespace mpsteer::agent_e2e
