// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/watch.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace mpsteer::agent {

Watch::Watch(int epoll, std::string policies_dir, std::string state_dir)
    : epoll_(epoll), policies_dir_(std::move(policies_dir)), state_dir_(std::move(state_dir)) {
    netlink_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
    sockaddr_nl snl{};
    snl.nl_family = AF_NETLINK;
    snl.nl_groups = RTMGRP_LINK;
    bind(netlink_, reinterpret_cast<sockaddr*>(&snl), sizeof snl);
    epoll_event ev{EPOLLIN, {.fd = netlink_}};
    epoll_ctl(epoll_, EPOLL_CTL_ADD, netlink_, &ev);
}

Watch::~Watch() {
    for (int fd : {inotify_, netlink_})
        if (fd >= 0) {
            epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
            close(fd);
        }
}

bool Watch::handle(int fd) {
    if (fd == inotify_) return relevant_inotify();
    if (fd != netlink_) return false;
    char buf[8192];
    while (read(fd, buf, sizeof buf) > 0) {}
    return true;  // any link change: the interfaces are compared on reconcile
}

// Drains the inotify queue; true when something that matters changed. In the state
// directory only the suspend flag matters (the agent writes its status there itself).
bool Watch::relevant_inotify() {
    alignas(inotify_event) char buf[16384];
    bool relevant = false;
    for (;;) {
        ssize_t n = read(inotify_, buf, sizeof buf);
        if (n <= 0) break;
        for (char* p = buf; p < buf + n;) {
            auto* ev = reinterpret_cast<inotify_event*>(p);
            std::string name = ev->len ? ev->name : "";
            if (ev->wd == state_wd_)
                relevant |= name == "suspended";
            else if (ev->wd == parent_wd_)
                relevant |= name == link_name_;
            else
                relevant = true;
            p += sizeof(inotify_event) + ev->len;
        }
    }
    return relevant;
}

void Watch::follow(const std::string& root) {
    if (root == watched_root_) return;
    if (inotify_ >= 0) {
        epoll_ctl(epoll_, EPOLL_CTL_DEL, inotify_, nullptr);
        close(inotify_);
    }
    inotify_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    epoll_event ev{EPOLLIN, {.fd = inotify_}};
    epoll_ctl(epoll_, EPOLL_CTL_ADD, inotify_, &ev);
    // The parent sees a symlink flip (git-sync renames a new link over the old one).
    auto abs = fs::absolute(policies_dir_).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();
    link_name_ = abs.filename().string();
    parent_wd_ = inotify_add_watch(inotify_, abs.parent_path().c_str(),
                                   IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB);
    state_wd_ = inotify_add_watch(inotify_, state_dir_.c_str(), IN_CREATE | IN_DELETE);
    const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |
                          IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB;
    std::error_code ec;
    if (inotify_add_watch(inotify_, root.c_str(), mask) < 0) return;
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
         it.increment(ec))
        if (it->is_directory()) inotify_add_watch(inotify_, it->path().c_str(), mask);
    watched_root_ = root;
}

}  // namespace mpsteer::agent
