// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What makes the agent look at its policies again: inotify on the policy directory (its tree,
// and its parent for a git-sync symlink flip), on the state directory (the suspend flag) and
// rtnetlink link events (interfaces coming and going).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "net/fd.h"

namespace mpsteer::agent {

// Directories of the policy tree watched at most (one inotify watch each, from the host-wide
// budget of root's watches); a tree with more is refused as a whole, never watched in part.
inline constexpr size_t kMaxWatchedDirectories = 1024;

// An interface going up or down: administratively up and running (carrier), or not.
struct LinkChange {
    std::string interface;
    bool up = false;
};

class Watch {
public:
    // Adds its descriptors to `epoll` (which must outlive it).
    Watch(int epoll, std::string policies_dir, std::string state_dir);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // Watches the tree at `root` (the policy directory as resolved); a new root drops the old
    // watches. Only real directories beneath `root` are watched (a symlink is never followed,
    // hidden directories but .git itself are left out, as the revision's content leaves them
    // out), at most kMaxWatchedDirectories. Returns "" or why the tree is not watched (then
    // only a flip of the policy link and the resync bring a change). Nothing to do while `root`
    // stays watched.
    std::string follow(const std::string& root);
    // Whether follow() refused the tree for its size (a property of the revision), not for a
    // passing reason such as the host's inotify limit.
    bool too_many_directories() const { return too_many_directories_; }
    // Handles a readable descriptor: true when something changed that calls for a reconcile.
    // False also for a descriptor that is not the watch's (owns() says).
    bool handle(int fd);
    bool owns(int fd) const { return fd == inotify_.get() || fd == netlink_.get(); }
    // The links that went up or down since the last call (an interface seen for the first
    // time counts as a change), oldest first.
    std::vector<LinkChange> take_link_changes() { return std::exchange(link_changes_, {}); }

private:
    bool relevant_inotify();
    void reset_inotify();
    std::string watch_tree(const std::string& root);
    int epoll_;
    std::string policies_dir_, state_dir_, watched_root_, link_name_, tree_error_;
    bool too_many_directories_ = false;
    net::Fd inotify_, netlink_;
    int state_wd_ = -1, parent_wd_ = -1, root_wd_ = -1;
    std::map<int, bool> link_up_;  // by ifindex, as last heard
    std::vector<LinkChange> link_changes_;
};

}  // namespace mpsteer::agent
