// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent: keeps a host's datapath equal to the policies in a directory (GitOps semantics).
// A revision is the whole directory at one moment; it is validated and compiled as a whole,
// built into a new generation, pre-flighted, switched in on every hook at once and recorded.
// An invalid revision never disturbs the running generation.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datapath/datapath.h"

namespace mpsteer::agent {

struct Config {
    std::string policies_dir;
    std::string state_dir = "/run/mpsteer";
    std::string pin_root = "/sys/fs/bpf/mpsteer";
    // Interfaces for policies that name none. Empty: every interface but loopback.
    std::vector<std::string> interfaces;
    std::chrono::milliseconds debounce{50};
    std::chrono::seconds resync{30};  // full re-check even without events
    int metrics_port = 9477;          // HTTP /metrics on 127.0.0.1; 0: off
    std::string metrics_textfile;     // node_exporter textfile collector path; "": off
    bool detach_on_exit = false;
    // Run in this named network namespace (/run/netns/NAME) but keep the host's mount
    // namespace, so pins on the host's bpffs outlive the agent (ip netns exec would not).
    std::string netns;
    // The Lua hooks' event thread (lua/README.md, "Event latency"): how it waits for datapath
    // events. "wait" sleeps in epoll (every event pays a wake-up), "spin" polls the ring on
    // one CPU all the time, "adaptive" polls for events_spin after each event, then sleeps.
    std::string events_mode = "wait";
    std::chrono::microseconds events_spin{1000};
    int events_rt_priority = 0;   // SCHED_FIFO priority of the event thread; 0: SCHED_OTHER
    int events_cpu = -1;          // pin the event thread to this CPU; -1: any
    datapath::TableSizes tables;  // state table sizes when this agent creates them
};

// What a directory holds right now. `id` names it for people (a commit hash from a git-sync
// symlink or .git/HEAD, else "sha256:<content>"); `content` decides whether anything changed.
struct Revision {
    std::string id;
    std::string content;  // SHA-256 of the files (relative path + bytes), hex
    std::string root;     // the directory actually read (symlinks resolved)
};
Revision snapshot(const std::string& dir);

// Files under the state directory.
std::string status_path(const std::string& state_dir);     // status.json
std::string events_path(const std::string& state_dir);     // events.jsonl
std::string suspended_path(const std::string& state_dir);  // exists while suspended
std::string applied_path(const std::string& state_dir);    // state/applied.json (plan model)

// Runs until SIGINT/SIGTERM. Returns the process exit status.
int run(const Config& cfg);

// Removes every pin, link and map of mpsteer under pin_root and the state files. Refuses (Error)
// while an agent runs.
void reset(const std::string& pin_root, const std::string& state_dir);

// The status file as JSON; an "agent_running" key says whether its writer is alive.
nlohmann::json read_status(const std::string& state_dir);

}  // namespace mpsteer::agent
