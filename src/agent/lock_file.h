// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's locks, held by the running agent for its whole life: an flock on
// <state_dir>/agent.lock, and one on the pin root directory itself (one agent per pin root,
// whatever its state directory). Whoever else needs to know whether an agent runs (status,
// reset) asks here.
#pragma once

#include <optional>
#include <string>

#include "net/fd.h"

namespace mpsteer::agent {

class AgentLock {
public:
    // The lock, or nullopt when another process holds it. Creates the state directory.
    static std::optional<AgentLock> try_take(const std::string& state_dir);
    // Whether a live process holds the lock (false when the lock file does not exist).
    static bool held(const std::string& state_dir);
    // The pin root's lock, or nullopt when another process holds it. Creates the directory.
    static std::optional<AgentLock> try_take_pin_root(const std::string& pin_root);

    AgentLock(AgentLock&&) noexcept = default;
    AgentLock& operator=(AgentLock&&) = delete;
    AgentLock(const AgentLock&) = delete;

private:
    explicit AgentLock(net::Fd fd) : fd_(std::move(fd)) {}
    net::Fd fd_;
};

}  // namespace mpsteer::agent
