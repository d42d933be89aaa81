// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/lock_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>

namespace mpsteer::agent {
namespace {
std::string lock_path(const std::string& state_dir) {
    return state_dir + "/agent.lock";
}
}  // namespace

std::optional<AgentLock> AgentLock::try_take(const std::string& state_dir) {
    std::filesystem::create_directories(state_dir);
    net::Fd fd(open(lock_path(state_dir).c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd || flock(fd.get(), LOCK_EX | LOCK_NB)) return std::nullopt;
    return AgentLock(std::move(fd));
}

std::optional<AgentLock> AgentLock::try_take_pin_root(const std::string& pin_root) {
    std::filesystem::create_directories(pin_root);
    net::Fd fd(open(pin_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd || flock(fd.get(), LOCK_EX | LOCK_NB)) return std::nullopt;
    return AgentLock(std::move(fd));
}

bool AgentLock::held(const std::string& state_dir) {
    net::Fd fd(open(lock_path(state_dir).c_str(), O_RDWR | O_CLOEXEC));
    if (!fd) return false;
    return flock(fd.get(), LOCK_EX | LOCK_NB) != 0;  // closing fd drops the lock if we took it
}

}  // namespace mpsteer::agent
