// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What makes the agent look at its policies again: inotify on the policy directory (its tree,
// and its parent for a git-sync symlink flip), on the state directory (the suspend flag) and
// rtnetlink link events (interfaces coming and going).
#pragma once

#include <string>

namespace mpsteer::agent {

class Watch {
public:
    // Adds its descriptors to `epoll` (which must outlive it).
    Watch(int epoll, std::string policies_dir, std::string state_dir);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // Watches the tree at `root` (the policy directory as resolved); a new root drops the old
    // watches. Does nothing when `root` is already watched.
    void follow(const std::string& root);
    // Handles a readable descriptor: true when something changed that calls for a reconcile.
    // False also for a descriptor that is not the watch's (owns() says).
    bool handle(int fd);
    bool owns(int fd) const { return fd == inotify_ || fd == netlink_; }

private:
    bool relevant_inotify();
    int epoll_;
    std::string policies_dir_, state_dir_, watched_root_, link_name_;
    int inotify_ = -1, netlink_ = -1, state_wd_ = -1, parent_wd_ = -1;
};

}  // namespace mpsteer::agent
