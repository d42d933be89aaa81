// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace fs = std::filesystem;

namespace mpsteer::agent {

Watch::Watch(int epoll, std::string policies_dir, std::string state_dir)
    : epoll_(epoll), policies_dir_(std::move(policies_dir)), state_dir_(std::move(state_dir)) {
    netlink_.reset(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE));
    sockaddr_nl snl{};
    snl.nl_family = AF_NETLINK;
    snl.nl_groups = RTMGRP_LINK;
    bind(netlink_.get(), reinterpret_cast<sockaddr*>(&snl), sizeof snl);
    epoll_event ev{EPOLLIN, {.fd = netlink_.get()}};
    epoll_ctl(epoll_, EPOLL_CTL_ADD, netlink_.get(), &ev);
}

Watch::~Watch() {
    for (int fd : {inotify_.get(), netlink_.get()})
        if (fd >= 0) epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
}

bool Watch::handle(int fd) {
    if (fd == inotify_.get()) return relevant_inotify();
    if (fd != netlink_.get()) return false;
    alignas(nlmsghdr) char buf[8192];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
        size_t left = size_t(n);
        for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) continue;
            if (h->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) continue;
            auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(h));
            std::string name;
            int alen = int(h->nlmsg_len - NLMSG_LENGTH(sizeof *ifi));
            for (auto* a = IFLA_RTA(ifi); RTA_OK(a, alen); a = RTA_NEXT(a, alen))
                if (a->rta_type == IFLA_IFNAME)
                    name.assign(static_cast<const char*>(RTA_DATA(a)),
                                strnlen(static_cast<const char*>(RTA_DATA(a)), RTA_PAYLOAD(a)));
            const bool up = h->nlmsg_type == RTM_NEWLINK && (ifi->ifi_flags & IFF_UP) &&
                            (ifi->ifi_flags & IFF_RUNNING);
            auto it = link_up_.find(ifi->ifi_index);
            if (it != link_up_.end() && it->second == up) continue;
            link_up_[ifi->ifi_index] = up;
            if (h->nlmsg_type == RTM_DELLINK) link_up_.erase(ifi->ifi_index);
            if (!name.empty()) link_changes_.push_back({name, up});
        }
    }
    return true;  // any link change: the interfaces are compared on reconcile
}

// Drains the inotify queue; true when something that matters changed. In the state
// directory only the suspend flag matters (the agent writes its status there itself).
bool Watch::relevant_inotify() {
    alignas(inotify_event) char buf[16384];
    bool relevant = false;
    for (;;) {
        ssize_t n = read(inotify_.get(), buf, sizeof buf);
        if (n <= 0) break;
        for (char* p = buf; p < buf + n;) {
            auto* ev = reinterpret_cast<inotify_event*>(p);
            std::string name = ev->len ? ev->name : "";
            if (ev->wd == root_wd_ && (ev->mask & IN_IGNORED))
                watched_root_.clear();  // the root went away: watched anew when it is back
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

namespace {
// The directory `rel` beneath `root_fd`, opened one component at a time without following a
// symlink: it cannot lead out of the tree, whatever was renamed meanwhile.
net::Fd open_beneath(int root_fd, const std::string& rel) {
    net::Fd fd(fcntl(root_fd, F_DUPFD_CLOEXEC, 0));
    for (size_t start = 0; fd && start < rel.size();) {
        size_t end = rel.find('/', start);
        if (end == std::string::npos) end = rel.size();
        const std::string name = rel.substr(start, end - start);
        fd.reset(openat(fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        start = end + 1;
    }
    return fd;
}
}  // namespace

// Breadth first by relative path, so no more than two descriptors are open at a time.
std::string Watch::watch_tree(const std::string& root) {
    const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |
                          IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB | IN_ONLYDIR;
    net::Fd root_fd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root_fd) return root + ": " + std::strerror(errno);
    too_many_directories_ = false;
    std::vector<std::string> pending = {""};
    std::string error;
    for (size_t next = 0; next < pending.size() && error.empty(); ++next) {
        const std::string rel = pending[next];
        net::Fd fd = open_beneath(root_fd.get(), rel);
        if (!fd) continue;  // replaced by a link or removed meanwhile: not ours to watch
        // The descriptor's /proc name is the directory just opened, not a path to resolve again.
        const std::string self = "/proc/self/fd/" + std::to_string(fd.get());
        int wd = inotify_add_watch(inotify_.get(), self.c_str(), mask);
        if (wd < 0) {
            error = std::string("watching ") + (rel.empty() ? "the policy directory" : rel) + ": " +
                    std::strerror(errno) +
                    (errno == ENOSPC ? " (the host's fs.inotify.max_user_watches)" : "");
            break;
        }
        if (rel.empty()) root_wd_ = wd;
        DIR* dir = fdopendir(fd.get());  // once it succeeds, closedir() closes the descriptor
        if (!dir) continue;
        fd.release();
        const bool descend = rel != ".git";  // .git: its own changes (HEAD, a fetch), not below
        while (dirent* e = descend ? readdir(dir) : nullptr) {
            const std::string name = e->d_name;
            if (name == "." || name == "..") continue;
            if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;  // links included
            if (name[0] == '.' && !(rel.empty() && name == ".git")) continue;
            if (pending.size() >= kMaxWatchedDirectories) {
                too_many_directories_ = true;
                error = "the policy directory has more than " +
                        std::to_string(kMaxWatchedDirectories) +
                        " directories (the agent watches at most that many)";
                break;
            }
            pending.push_back(rel.empty() ? name : rel + "/" + name);
        }
        closedir(dir);
    }
    return error;
}

// A new inotify instance with the watches outside the tree: the parent sees a symlink flip
// (git-sync renames a new link over the old one), the state directory the suspend flag.
void Watch::reset_inotify() {
    if (inotify_) {
        epoll_ctl(epoll_, EPOLL_CTL_DEL, inotify_.get(), nullptr);
        inotify_.reset();  // before the new one: each counts against the host's inotify limits
    }
    inotify_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    epoll_event ev{EPOLLIN, {.fd = inotify_.get()}};
    epoll_ctl(epoll_, EPOLL_CTL_ADD, inotify_.get(), &ev);
    auto abs = fs::absolute(policies_dir_).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();
    link_name_ = abs.filename().string();
    parent_wd_ = inotify_add_watch(inotify_.get(), abs.parent_path().c_str(),
                                   IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB);
    state_wd_ = inotify_add_watch(inotify_.get(), state_dir_.c_str(), IN_CREATE | IN_DELETE);
    root_wd_ = -1;
}

std::string Watch::follow(const std::string& root) {
    // A refused tree is looked at again each time: it may have shrunk in place.
    if (root == watched_root_ && tree_error_.empty()) return "";
    reset_inotify();
    tree_error_ = watch_tree(root);
    if (!tree_error_.empty()) reset_inotify();  // never a partial watch of the tree
    watched_root_ = root;
    return tree_error_;
}

}  // namespace mpsteer::agent
