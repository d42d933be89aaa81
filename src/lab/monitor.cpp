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
#include "net/mptcp_pm.h"

namespace mpsteer::lab {

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
    uint32_t group = 0;
    try {
        fd_ = net::open_genl_socket();
        net::GenlFamily family = net::resolve_mptcp_pm_family(fd_.get());
        auto events = family.multicast_groups.find(MPTCP_PM_EV_GRP_NAME);
        if (events == family.multicast_groups.end() || !events->second)
            throw Error("mptcp monitor: no " MPTCP_PM_EV_GRP_NAME " group");
        group = events->second;
    } catch (const net::NetlinkError& e) {
        throw Error(std::string("mptcp monitor: ") + e.what());  // lab::Error, as callers expect
    }
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
            // Address attributes shorter than an address are skipped, never read past.
            net::for_each_nlattr(net::genl_attrs(nh), [&](int t, std::span<const char> v) {
                switch (t) {
                case MPTCP_ATTR_TOKEN: e.token = net::nlattr_value<uint32_t>(v); break;
                case MPTCP_ATTR_LOC_ID: e.loc_id = net::nlattr_value<uint8_t>(v); break;
                case MPTCP_ATTR_REM_ID: e.rem_id = net::nlattr_value<uint8_t>(v); break;
                case MPTCP_ATTR_SADDR4:
                    if (v.size() >= 4) e.saddr = net::address_text(4, v.data());
                    break;
                case MPTCP_ATTR_DADDR4:
                    if (v.size() >= 4) e.daddr = net::address_text(4, v.data());
                    break;
                case MPTCP_ATTR_SADDR6:
                    if (v.size() >= 16) e.saddr = net::address_text(6, v.data());
                    break;
                case MPTCP_ATTR_DADDR6:
                    if (v.size() >= 16) e.daddr = net::address_text(6, v.data());
                    break;
                case MPTCP_ATTR_SPORT: e.sport = ntohs(net::nlattr_value<uint16_t>(v)); break;
                case MPTCP_ATTR_DPORT: e.dport = ntohs(net::nlattr_value<uint16_t>(v)); break;
                }
            });
            out.push_back(std::move(e));
        }
        wait_ms = 0;  // drain what is queued, then return
    }
    return out;
}

}  // namespace mpsteer::lab
