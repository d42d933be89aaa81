// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The kernel's MPTCP in-kernel path manager over generic netlink: its endpoints listed, added,
// removed and renewed (what `ip mptcp endpoint` does). Also the generic-netlink pieces every
// user of the mptcp_pm family shares (lab::MptcpMonitor too): opening the socket, resolving a
// family and its multicast groups, and a bounded walk over the attributes of a reply.
#pragma once

#include <linux/netlink.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/fd.h"

namespace mpsteer::net {

// A netlink operation that failed: the message names the operation, the errno's text and what
// the kernel said (extended ACK). `error` is the errno: the kernel's, EINVAL for an address
// that does not parse, EPROTO for a reply that makes no sense.
struct NetlinkError : std::runtime_error {
    NetlinkError(const std::string& what, int error) : std::runtime_error(what), error(error) {}
    int error;
};

// ---- generic netlink -----------------------------------------------------------------------

// Calls visit(type, value) for each attribute in `attrs`, type without the NLA_F_NESTED and
// NLA_F_NET_BYTEORDER bits. Replies are parsed, never trusted: the walk stops at the first
// attribute whose length is impossible or runs past the end.
template <typename Visit>
void for_each_nlattr(std::span<const char> attrs, Visit&& visit) {
    while (attrs.size() >= NLA_HDRLEN) {
        nlattr a;
        std::memcpy(&a, attrs.data(), sizeof a);
        if (a.nla_len < NLA_HDRLEN || a.nla_len > attrs.size()) return;
        visit(int(a.nla_type & NLA_TYPE_MASK), attrs.subspan(NLA_HDRLEN, a.nla_len - NLA_HDRLEN));
        attrs = attrs.subspan(std::min<size_t>(NLA_ALIGN(a.nla_len), attrs.size()));
    }
}

// A fixed-size attribute value. A shorter attribute reads zero-filled, never past its end.
template <typename T>
T nlattr_value(std::span<const char> value) {
    T v{};
    std::memcpy(&v, value.data(), std::min(value.size(), sizeof v));
    return v;
}

// The attributes of a generic-netlink message (after its genl header); empty when the message
// is too short to hold one. `nh` must have passed NLMSG_OK.
std::span<const char> genl_attrs(const nlmsghdr* nh);

// A NETLINK_GENERIC socket in the calling thread's network namespace, with extended ACKs on
// (the kernel's error messages) and capped ACKs (no echo of the request).
Fd open_genl_socket();

struct GenlFamily {
    uint16_t id = 0;
    uint32_t version = 0;
    std::map<std::string, uint32_t> multicast_groups;  // name -> group id
};
// Asks the generic-netlink controller over `genl_fd` (a NETLINK_GENERIC socket) for the
// family `name`. Throws NetlinkError, error ENOENT when the kernel has no such family.
GenlFamily resolve_genl_family(int genl_fd, const std::string& name);
// The same for MPTCP_PM_NAME ("mptcp_pm"), with a message saying the kernel has no MPTCP when
// it is missing.
GenlFamily resolve_mptcp_pm_family(int genl_fd);

// ---- MPTCP endpoints -----------------------------------------------------------------------

struct MptcpEndpoint {
    uint8_t id = 0;       // 1..255; 0 in add(): the kernel picks one
    std::string address;  // "10.0.2.1", "fd00:2::1"
    int ifindex = 0;      // the interface its subflows leave by; 0: as routed
    uint32_t flags = 0;   // MPTCP_PM_ADDR_FLAG_* (signal, subflow, backup, fullmesh, implicit)
    uint16_t port = 0;    // 0: none (only a signal endpoint may have one)

    bool operator==(const MptcpEndpoint&) const = default;
};
// "id 3 10.0.2.1 subflow,backup dev 5", for logs and error messages.
std::string to_string(const MptcpEndpoint& endpoint);

// The in-kernel path manager's endpoints of one network namespace, over one generic-netlink
// socket opened in the calling thread's namespace (enter it first, e.g. with lab::NetnsGuard).
// Every request is acknowledged by the kernel; errors are NetlinkError.
class MptcpPathManager {
public:
    MptcpPathManager();  // throws when the kernel has no MPTCP

    std::vector<MptcpEndpoint> endpoints();  // ordered by id, as the kernel dumps them
    void add(const MptcpEndpoint& endpoint);
    void remove(uint8_t id);  // throws naming the id when there is no such endpoint
    // Deletes and re-adds each endpoint with this address (same id, flags, interface, port):
    // the kernel closes the subflows bound to the address and, for a `subflow` endpoint, opens
    // new ones on every existing connection (within the limits). Returns false when no
    // endpoint has the address. Not atomic: re-adding is tried again a few times (the kernel
    // may still hold the id for a moment), and an endpoint that still could not be re-added is
    // kept here and added first by the next renew() of its address (the error says so meanwhile).
    // Implicit endpoints (made by the kernel) cannot be re-added, so renewing one throws before
    // deleting anything.
    bool renew(const std::string& address);

private:
    void add_again(const MptcpEndpoint& e, const std::string& what);
    Fd fd_;
    uint16_t family_id_ = 0;
    // By address: endpoints renew() deleted and could not add again yet.
    std::map<std::string, std::vector<MptcpEndpoint>> not_readded_;
};

}  // namespace mpsteer::net
