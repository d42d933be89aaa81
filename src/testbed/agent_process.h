// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The real agent (`mpsteer run`: the node's binary, beside this one) as a child process on a
// copy of the shipped policies, inside one of the lab's namespaces: what `mpsteer demo` shows
// and what `mpsteer bench --live` measures.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mpsteer::cli {

// Where the shipped policies/ and lua/ are: the source tree the binary was built in, or where
// the package installs them.
std::string default_share();
// The node's binary, mpsteer, which runs the agent (empty if it is not installed).
std::string agent_binary();
// Where a shipped file (policies/..., lua/...) is under `share`: the source tree has lua/ beside
// policies/, the package keeps it in policies/lua/ (a repository root of its own).
std::string shipped_path(const std::string& share, const std::string& rel);

// The shipped policy files written for another kind of host than the lab's client (they name
// interfaces it does not have), and that host: what the demo and the live benchmark leave out.
struct ShippedElsewhere {
    std::string file;  // under policies/
    std::string host;
};
const std::vector<ShippedElsewhere>& shipped_elsewhere();

class ShippedAgent {
public:
    // Copies <share>/policies and <share>/lua into /run/mpsteer-<name>/repo (the repository
    // the agent watches, as git-sync would publish it) and starts the agent in `netns` with
    // pins under /sys/fs/bpf/mpsteer-<name>, its output in /run/mpsteer-<name>/agent.log.
    // `leave_out`: files under policies/ not copied (examples for another kind of host).
    ShippedAgent(const std::string& share, const std::string& netns, const std::string& name,
                 const std::vector<std::string>& leave_out = {});
    // Stops the agent and removes its pins and state.
    ~ShippedAgent();
    ShippedAgent(const ShippedAgent&) = delete;
    ShippedAgent& operator=(const ShippedAgent&) = delete;

    // The status once Ready; throws (with the log's tail on stderr) when the agent exits,
    // reports an error or is not Ready within `timeout`.
    // The first apply loads the datapath: every program through the verifier takes a second
    // on a server, longer on a small board, minutes under emulation (the VM rig).
    static constexpr std::chrono::seconds kFirstApplyTimeout{300};
    nlohmann::json wait_ready(std::chrono::seconds timeout = kFirstApplyTimeout);
    // status.json (an empty object while there is none).
    nlohmann::json status() const;
    // Waits until the agent writes its status again (false after `timeout`).
    bool wait_status_update(std::chrono::seconds timeout) const;
    void stop();  // SIGTERM, SIGKILL after 5 s

    const std::vector<std::string>& args() const { return args_; }
    const std::string& state_dir() const { return state_; }
    const std::string& pin_root() const { return pins_; }
    const std::string& log() const { return log_; }
    pid_t pid() const { return pid_; }

private:
    bool alive();
    std::string state_, pins_, log_;
    std::vector<std::string> args_;
    pid_t pid_ = -1;
};

}  // namespace mpsteer::cli
