// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// MPTCP path-manager events over generic netlink (what `ip mptcp monitor` prints), read in
// process: subscribing is synchronous, so unlike a child `ip mptcp monitor` nothing races.
#include <arpa/inet.h>
#include <linux/genetlink.h>
#include <linux/mptcp.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lab/lab.h"
#include "net/address.h"
#include "net/fd.h"

namespace mpsteer::lab {

namespace {

// Walks the netlink attributes in [p, p + len).
template <typename F>
void for_each_attr(const char* p, size_t len, F f) {
    while (len >= NLA_HDRLEN) {
        auto* a = reinterpret_cast<const nlattr*>(p);
        if (a->nla_len < NLA_HDRLEN || a->nla_len > len) return;
        f(a->nla_type & NLA_TYPE_MASK, p + NLA_HDRLEN, a->nla_len - NLA_HDRLEN);
        size_t step = NLA_ALIGN(a->nla_len);
        if (step >= len) return;
        p += step;
        len -= step;
    }
}

template <typename T>
T attr_val(const char* data, size_t len) {
    T v{};
    std::memcpy(&v, data, len < sizeof v ? len : sizeof v);
    return v;
}

// Resolves the mptcp_pm family's event multicast group id.
uint32_t resolve_group(int fd) {
    struct {
        nlmsghdr nh;
        genlmsghdr gh;
        char attrs[64];
    } req{};
    req.nh.nlmsg_type = GENL_ID_CTRL;
    req.nh.nlmsg_flags = NLM_F_REQUEST;
    req.nh.nlmsg_seq = 1;
    req.gh.cmd = CTRL_CMD_GETFAMILY;
    req.gh.version = 1;
    auto* a = reinterpret_cast<nlattr*>(req.attrs);
    a->nla_type = CTRL_ATTR_FAMILY_NAME;
    a->nla_len = NLA_HDRLEN + sizeof MPTCP_PM_NAME;
    std::memcpy(req.attrs + NLA_HDRLEN, MPTCP_PM_NAME, sizeof MPTCP_PM_NAME);
    req.nh.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN) + NLA_ALIGN(a->nla_len);
    if (send(fd, &req, req.nh.nlmsg_len, 0) < 0)
        throw Error(std::string("mptcp monitor: send: ") + std::strerror(errno));

    alignas(nlmsghdr) char buf[8192];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) throw Error(std::string("mptcp monitor: recv: ") + std::strerror(errno));
    auto* nh = reinterpret_cast<nlmsghdr*>(buf);
    if (!NLMSG_OK(nh, n)) throw Error("mptcp monitor: short reply");
    if (nh->nlmsg_type == NLMSG_ERROR)
        throw Error("mptcp monitor: no mptcp_pm genl family (kernel without MPTCP?)");
    uint32_t group = 0;
    const char* attrs = static_cast<const char*>(NLMSG_DATA(nh)) + GENL_HDRLEN;
    size_t alen = nh->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
    for_each_attr(attrs, alen, [&](int type, const char* d, size_t l) {
        if (type != CTRL_ATTR_MCAST_GROUPS) return;
        for_each_attr(d, l, [&](int, const char* gd, size_t gl) {
            std::string name;
            uint32_t id = 0;
            for_each_attr(gd, gl, [&](int t, const char* v, size_t vl) {
                if (t == CTRL_ATTR_MCAST_GRP_NAME) name.assign(v, strnlen(v, vl));
                if (t == CTRL_ATTR_MCAST_GRP_ID) id = attr_val<uint32_t>(v, vl);
            });
            if (name == MPTCP_PM_EV_GRP_NAME) group = id;
        });
    });
    if (!group) throw Error("mptcp monitor: no " MPTCP_PM_EV_GRP_NAME " group");
    return group;
}

}  // namespace

std::string event_name(uint32_t type) {
    switch (type) {
    case MPTCP_EVENT_CREATED: return "created";
    case MPTCP_EVENT_ESTABLISHED: return "established";
    case MPTCP_EVENT_CLOSED: return "closed";
    case MPTCP_EVENT_ANNOUNCED: return "announced";
    case MPTCP_EVENT_REMOVED: return "removed";
    case MPTCP_EVENT_SUB_ESTABLISHED: return "sf_established";
    case MPTCP_EVENT_SUB_CLOSED: return "sf_closed";
    case MPTCP_EVENT_SUB_PRIORITY: return "sf_priority";
    case 15: return "listener_created";  // MPTCP_EVENT_LISTENER_* (Linux 6.2, not in these headers)
    case 16: return "listener_closed";
    default: return "event" + std::to_string(type);
    }
}

std::string to_string(const MptcpEvent& e) {
    char tok[16];
    std::snprintf(tok, sizeof tok, "%08x", e.token);
    std::string s = event_name(e.type) + " token=" + tok;
    if (!e.saddr.empty()) s += " " + e.saddr + ":" + std::to_string(e.sport);
    if (!e.daddr.empty()) s += " -> " + e.daddr + ":" + std::to_string(e.dport);
    return s;
}

MptcpMonitor::MptcpMonitor(const std::string& netns) {
    NetnsGuard in(netns);  // the socket belongs to this namespace for its whole life
    fd_.reset(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC));
    if (!fd_) throw Error(std::string("mptcp monitor: socket: ") + std::strerror(errno));
    uint32_t group = resolve_group(fd_.get());
    if (setsockopt(fd_.get(), SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof group) != 0)
        throw Error(std::string("mptcp monitor: join group: ") + std::strerror(errno));
    int big = 1 << 20;  // bursts of events from many subflows
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
}

std::vector<MptcpEvent> MptcpMonitor::poll(std::chrono::milliseconds timeout) {
    std::vector<MptcpEvent> out;
    pollfd p{fd_.get(), POLLIN, 0};
    int wait_ms = static_cast<int>(timeout.count());
    while (::poll(&p, 1, wait_ms) > 0) {
        alignas(nlmsghdr) char buf[16384];
        ssize_t n = recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) break;
            if (errno == ENOBUFS) continue;  // overrun: some events lost, read on
            throw Error(std::string("mptcp monitor: recv: ") + std::strerror(errno));
        }
        for (auto* nh = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(nh, n); nh = NLMSG_NEXT(nh, n)) {
            if (nh->nlmsg_type < NLMSG_MIN_TYPE) continue;
            auto* gh = static_cast<const genlmsghdr*>(NLMSG_DATA(nh));
            MptcpEvent e;
            e.type = gh->cmd;
            const char* attrs = reinterpret_cast<const char*>(gh) + GENL_HDRLEN;
            for_each_attr(attrs, nh->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN),
                          [&](int t, const char* v, size_t l) {
                              switch (t) {
                              case MPTCP_ATTR_TOKEN: e.token = attr_val<uint32_t>(v, l); break;
                              case MPTCP_ATTR_LOC_ID: e.loc_id = attr_val<uint8_t>(v, l); break;
                              case MPTCP_ATTR_REM_ID: e.rem_id = attr_val<uint8_t>(v, l); break;
                              case MPTCP_ATTR_SADDR4: e.saddr = net::address_text(4, v); break;
                              case MPTCP_ATTR_DADDR4: e.daddr = net::address_text(4, v); break;
                              case MPTCP_ATTR_SADDR6: e.saddr = net::address_text(6, v); break;
                              case MPTCP_ATTR_DADDR6: e.daddr = net::address_text(6, v); break;
                              case MPTCP_ATTR_SPORT:
                                  e.sport = ntohs(attr_val<uint16_t>(v, l));
                                  break;
                              case MPTCP_ATTR_DPORT:
                                  e.dport = ntohs(attr_val<uint16_t>(v, l));
                                  break;
                              }
                          });
            out.push_back(std::move(e));
        }
        wait_ms = 0;  // drain what is queued, then return
    }
    return out;
}

}  // namespace mpsteer::lab
