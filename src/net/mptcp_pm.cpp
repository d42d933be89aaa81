// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "net/mptcp_pm.h"

#include <arpa/inet.h>
#include <linux/genetlink.h>
#include <linux/mptcp.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <utility>

#include "net/address.h"

namespace mpsteer::net {

namespace {

constexpr uint8_t kCtrlVersion = 2;
// Larger than any reply the kernel builds for us (a dump batch is at most about 32 KiB); a
// reply that still does not fit is an error, never silently cut.
constexpr size_t kReplyBufferBytes = 64 * 1024;

std::string errno_text(int error) {
    return std::strerror(error);
}

// A failed system call, from errno (read before anything else can change it).
NetlinkError errno_error(const std::string& what, const char* call) {
    const int error = errno;
    return NetlinkError(what + ": " + call + ": " + errno_text(error), error);
}

// A request under construction: netlink header, genl header, then attributes.
class GenlRequest {
public:
    GenlRequest(uint16_t family_id, uint8_t cmd, uint8_t version, uint16_t extra_flags) {
        nlmsghdr nh{};
        nh.nlmsg_type = family_id;
        nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | extra_flags;
        genlmsghdr gh{};
        gh.cmd = cmd;
        gh.version = version;
        append(&nh, sizeof nh);
        append(&gh, sizeof gh);
    }

    void put(uint16_t type, const void* data, size_t len) {
        align();
        nlattr a{uint16_t(NLA_HDRLEN + len), type};
        append(&a, sizeof a);
        append(data, len);
    }
    template <typename T>
    void put(uint16_t type, T value) {
        put(type, &value, sizeof value);
    }

    // A nested attribute holds every attribute put until end_nested(begin_nested(...)).
    size_t begin_nested(uint16_t type) {
        align();
        size_t at = buf_.size();
        nlattr a{NLA_HDRLEN, uint16_t(type | NLA_F_NESTED)};
        append(&a, sizeof a);
        return at;
    }
    void end_nested(size_t at) {
        align();
        auto len = uint16_t(buf_.size() - at);
        std::memcpy(buf_.data() + at + offsetof(nlattr, nla_len), &len, sizeof len);
    }

    // The bytes to send, with the length and sequence number filled in.
    std::span<const char> seal(uint32_t seq) {
        align();
        auto len = uint32_t(buf_.size());
        std::memcpy(buf_.data() + offsetof(nlmsghdr, nlmsg_len), &len, sizeof len);
        std::memcpy(buf_.data() + offsetof(nlmsghdr, nlmsg_seq), &seq, sizeof seq);
        return buf_;
    }

private:
    void align() { buf_.resize(NLA_ALIGN(buf_.size())); }
    void append(const void* data, size_t len) {
        auto* bytes = static_cast<const char*>(data);
        buf_.insert(buf_.end(), bytes, bytes + len);
    }
    std::vector<char> buf_;
};

uint32_t next_sequence() {
    // Unique per process, hence per socket; 0 is what notifications carry, so never used.
    static std::atomic<uint32_t> next{1};
    uint32_t seq;
    do seq = next.fetch_add(1);
    while (seq == 0);
    return seq;
}

// What the kernel said about a refused request (NLMSGERR_ATTR_MSG), if it said anything. The
// extended-ACK attributes start `offset` bytes into the message's payload.
std::string kernel_message(const nlmsghdr* nh, size_t offset) {
    if (!(nh->nlmsg_flags & NLM_F_ACK_TLVS)) return {};
    size_t payload = nh->nlmsg_len - NLMSG_HDRLEN;
    if (offset >= payload) return {};
    std::span<const char> tlvs(static_cast<const char*>(NLMSG_DATA(nh)) + offset, payload - offset);
    std::string text;
    for_each_nlattr(tlvs, [&](int type, std::span<const char> v) {
        if (type == NLMSGERR_ATTR_MSG) text.assign(v.data(), strnlen(v.data(), v.size()));
    });
    return text;
}

NetlinkError refused(const std::string& what, int error, const std::string& kernel_says) {
    std::string text = what + ": " + errno_text(error);
    if (!kernel_says.empty()) text += " (kernel: " + kernel_says + ")";
    return NetlinkError(text, error);
}

// Sends `req` on `fd` and reads until the kernel's ACK (or NLMSG_DONE, which ends a dump: the
// kernel sends no ACK after one). Returns the data messages of this request, each a whole
// netlink message; they are parsed only after the exchange is complete, so a bad one never
// leaves a dump half read. Throws NetlinkError naming `what` when the kernel refuses.
std::vector<std::vector<char>> transact(int fd, GenlRequest& req, const std::string& what) {
    const uint32_t seq = next_sequence();
    std::span<const char> msg = req.seal(seq);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    const auto* to = reinterpret_cast<const sockaddr*>(&kernel);
    if (sendto(fd, msg.data(), msg.size(), 0, to, sizeof kernel) < 0)
        throw errno_error(what, "send");

    std::vector<std::vector<char>> replies;
    std::vector<char> buf(kReplyBufferBytes);
    for (;;) {
        sockaddr_nl from{};
        iovec iov{buf.data(), buf.size()};
        msghdr mh{};
        mh.msg_name = &from;
        mh.msg_namelen = sizeof from;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        ssize_t n = recvmsg(fd, &mh, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw errno_error(what, "recv");
        }
        if (mh.msg_flags & MSG_TRUNC)
            throw NetlinkError(
                what + ": a reply larger than " + std::to_string(buf.size()) + " bytes", EMSGSIZE);
        if (from.nl_pid != 0) continue;  // another process, not the kernel
        int left = int(n);
        for (auto* nh = reinterpret_cast<const nlmsghdr*>(buf.data()); NLMSG_OK(nh, left);
             nh = NLMSG_NEXT(nh, left)) {
            // Another sequence: the rest of an earlier request given up on, or a notification.
            if (nh->nlmsg_seq != seq) continue;
            const size_t payload = nh->nlmsg_len - NLMSG_HDRLEN;
            switch (nh->nlmsg_type) {
            case NLMSG_NOOP: break;
            case NLMSG_OVERRUN: throw NetlinkError(what + ": netlink overrun", EPROTO);
            case NLMSG_ERROR: {
                nlmsgerr err;
                if (payload < sizeof err)
                    throw NetlinkError(what + ": truncated error reply", EPROTO);
                std::memcpy(&err, NLMSG_DATA(nh), sizeof err);
                if (err.error == 0) return replies;  // the ACK
                // Without NLM_F_CAPPED the kernel echoes our request before its attributes.
                size_t offset = sizeof err;
                if (!(nh->nlmsg_flags & NLM_F_CAPPED) && err.msg.nlmsg_len >= NLMSG_HDRLEN)
                    offset = NLMSG_ALIGN(offset + err.msg.nlmsg_len - NLMSG_HDRLEN);
                throw refused(what, -err.error, kernel_message(nh, offset));
            }
            case NLMSG_DONE: {
                int error = 0;
                if (payload >= sizeof error) std::memcpy(&error, NLMSG_DATA(nh), sizeof error);
                if (error < 0)
                    throw refused(what, -error, kernel_message(nh, NLMSG_ALIGN(sizeof error)));
                return replies;
            }
            default: {
                auto* bytes = reinterpret_cast<const char*>(nh);
                replies.emplace_back(bytes, bytes + nh->nlmsg_len);
            }
            }
        }
    }
}

// An address in network order; family as address.h has it (4 or 6).
struct BinaryAddress {
    uint8_t family = 4;
    unsigned char bytes[16] = {};
    size_t size() const { return family == 6 ? 16 : 4; }
};

BinaryAddress parse_address(const std::string& text, const std::string& what) {
    BinaryAddress a;
    if (inet_pton(AF_INET, text.c_str(), a.bytes) == 1) return a;
    if (inet_pton(AF_INET6, text.c_str(), a.bytes) == 1) {
        a.family = 6;
        return a;
    }
    throw NetlinkError(what + ": not an IPv4 or IPv6 address: '" + text + "'", EINVAL);
}

std::string flags_text(uint32_t flags) {
    static const std::pair<uint32_t, const char*> kNames[] = {
        {MPTCP_PM_ADDR_FLAG_SIGNAL, "signal"},     {MPTCP_PM_ADDR_FLAG_SUBFLOW, "subflow"},
        {MPTCP_PM_ADDR_FLAG_BACKUP, "backup"},     {MPTCP_PM_ADDR_FLAG_FULLMESH, "fullmesh"},
        {MPTCP_PM_ADDR_FLAG_IMPLICIT, "implicit"},
    };
    std::string text;
    for (auto [bit, name] : kNames) {
        if (!(flags & bit)) continue;
        text += (text.empty() ? "" : ",") + std::string(name);
        flags &= ~bit;
    }
    if (flags) {  // bits of a newer kernel
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%x", flags);
        text += (text.empty() ? "" : ",") + std::string(hex);
    }
    return text;
}

MptcpEndpoint parse_endpoint(std::span<const char> nested) {
    MptcpEndpoint e;
    uint16_t family = 0;
    std::span<const char> addr4, addr6;
    for_each_nlattr(nested, [&](int type, std::span<const char> v) {
        switch (type) {
        case MPTCP_PM_ADDR_ATTR_FAMILY: family = nlattr_value<uint16_t>(v); break;
        case MPTCP_PM_ADDR_ATTR_ID: e.id = nlattr_value<uint8_t>(v); break;
        case MPTCP_PM_ADDR_ATTR_ADDR4: addr4 = v; break;
        case MPTCP_PM_ADDR_ATTR_ADDR6: addr6 = v; break;
        case MPTCP_PM_ADDR_ATTR_PORT: e.port = nlattr_value<uint16_t>(v); break;
        case MPTCP_PM_ADDR_ATTR_FLAGS: e.flags = nlattr_value<uint32_t>(v); break;
        case MPTCP_PM_ADDR_ATTR_IF_IDX: e.ifindex = nlattr_value<int32_t>(v); break;
        }
    });
    if (family == AF_INET && addr4.size() >= 4)
        e.address = address_text(4, addr4.data());
    else if (family == AF_INET6 && addr6.size() >= 16)
        e.address = address_text(6, addr6.data());
    else
        throw NetlinkError("mptcp_pm: list endpoints: endpoint id " + std::to_string(e.id) +
                               " has no address of family " + std::to_string(family) +
                               " in the kernel's reply",
                           EPROTO);
    return e;
}

}  // namespace

// ---- generic netlink -----------------------------------------------------------------------

std::span<const char> genl_attrs(const nlmsghdr* nh) {
    const size_t header = NLMSG_LENGTH(GENL_HDRLEN);
    if (nh->nlmsg_len < header) return {};
    return {reinterpret_cast<const char*>(nh) + header, nh->nlmsg_len - header};
}

Fd open_genl_socket() {
    Fd fd(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC));
    if (!fd) throw errno_error("generic netlink", "socket");
    // Best effort: without them (kernels before 4.12) errors just lack the kernel's words.
    int on = 1;
    setsockopt(fd.get(), SOL_NETLINK, NETLINK_EXT_ACK, &on, sizeof on);
    setsockopt(fd.get(), SOL_NETLINK, NETLINK_CAP_ACK, &on, sizeof on);
    return fd;
}

GenlFamily resolve_genl_family(int genl_fd, const std::string& name) {
    const std::string what = "generic netlink family " + name;
    GenlRequest req(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, kCtrlVersion, 0);
    req.put(CTRL_ATTR_FAMILY_NAME, name.c_str(), name.size() + 1);
    GenlFamily family;
    for (const auto& reply : transact(genl_fd, req, what)) {
        auto* nh = reinterpret_cast<const nlmsghdr*>(reply.data());
        for_each_nlattr(genl_attrs(nh), [&](int type, std::span<const char> v) {
            if (type == CTRL_ATTR_FAMILY_ID) family.id = nlattr_value<uint16_t>(v);
            if (type == CTRL_ATTR_VERSION) family.version = nlattr_value<uint32_t>(v);
            if (type != CTRL_ATTR_MCAST_GROUPS) return;
            // An array: one nested attribute per group, each with a name and an id.
            for_each_nlattr(v, [&](int, std::span<const char> group) {
                std::string group_name;
                uint32_t group_id = 0;
                for_each_nlattr(group, [&](int t, std::span<const char> gv) {
                    if (t == CTRL_ATTR_MCAST_GRP_NAME)
                        group_name.assign(gv.data(), strnlen(gv.data(), gv.size()));
                    if (t == CTRL_ATTR_MCAST_GRP_ID) group_id = nlattr_value<uint32_t>(gv);
                });
                if (!group_name.empty()) family.multicast_groups[group_name] = group_id;
            });
        });
    }
    if (!family.id) throw NetlinkError(what + ": no family id in the controller's reply", EPROTO);
    return family;
}

GenlFamily resolve_mptcp_pm_family(int genl_fd) {
    try {
        return resolve_genl_family(genl_fd, MPTCP_PM_NAME);
    } catch (const NetlinkError& e) {
        if (e.error != ENOENT) throw;
        throw NetlinkError(std::string(e.what()) +
                               ": this kernel has no MPTCP path manager (built without "
                               "CONFIG_MPTCP?)",
                           ENOENT);
    }
}

// ---- MPTCP endpoints -----------------------------------------------------------------------

std::string to_string(const MptcpEndpoint& endpoint) {
    std::string text;
    if (endpoint.id) text = "id " + std::to_string(endpoint.id) + " ";
    text += endpoint.address;
    if (endpoint.port) text += " port " + std::to_string(endpoint.port);
    if (endpoint.flags) text += " " + flags_text(endpoint.flags);
    if (endpoint.ifindex) text += " dev " + std::to_string(endpoint.ifindex);
    return text;
}

MptcpPathManager::MptcpPathManager() : fd_(open_genl_socket()) {
    family_id_ = resolve_mptcp_pm_family(fd_.get()).id;
}

std::vector<MptcpEndpoint> MptcpPathManager::endpoints() {
    GenlRequest req(family_id_, MPTCP_PM_CMD_GET_ADDR, MPTCP_PM_VER, NLM_F_DUMP);
    std::vector<MptcpEndpoint> out;
    for (const auto& reply : transact(fd_.get(), req, "mptcp_pm: list endpoints")) {
        auto* nh = reinterpret_cast<const nlmsghdr*>(reply.data());
        for_each_nlattr(genl_attrs(nh), [&](int type, std::span<const char> v) {
            if (type == MPTCP_PM_ATTR_ADDR) out.push_back(parse_endpoint(v));
        });
    }
    return out;
}

void MptcpPathManager::add(const MptcpEndpoint& endpoint) {
    const std::string what = "mptcp_pm: add endpoint " + to_string(endpoint);
    const BinaryAddress a = parse_address(endpoint.address, what);
    GenlRequest req(family_id_, MPTCP_PM_CMD_ADD_ADDR, MPTCP_PM_VER, 0);
    size_t nest = req.begin_nested(MPTCP_PM_ATTR_ADDR);
    req.put<uint16_t>(MPTCP_PM_ADDR_ATTR_FAMILY, a.family == 6 ? AF_INET6 : AF_INET);
    // Without an id attribute the kernel picks one; an explicit 0 would be taken literally.
    if (endpoint.id) req.put<uint8_t>(MPTCP_PM_ADDR_ATTR_ID, endpoint.id);
    req.put(a.family == 6 ? MPTCP_PM_ADDR_ATTR_ADDR6 : MPTCP_PM_ADDR_ATTR_ADDR4, a.bytes, a.size());
    req.put<uint32_t>(MPTCP_PM_ADDR_ATTR_FLAGS, endpoint.flags);
    if (endpoint.ifindex) req.put<int32_t>(MPTCP_PM_ADDR_ATTR_IF_IDX, endpoint.ifindex);
    if (endpoint.port) req.put<uint16_t>(MPTCP_PM_ADDR_ATTR_PORT, endpoint.port);  // host order
    req.end_nested(nest);
    transact(fd_.get(), req, what);
}

void MptcpPathManager::remove(uint8_t id) {
    const std::string what = "mptcp_pm: remove endpoint id " + std::to_string(id);
    // The kernel reads id 0 as "the address of every connection's initial subflow", which
    // needs an address: not an endpoint this class can name.
    if (id == 0) throw NetlinkError(what + ": endpoint ids are 1 to 255", EINVAL);
    GenlRequest req(family_id_, MPTCP_PM_CMD_DEL_ADDR, MPTCP_PM_VER, 0);
    size_t nest = req.begin_nested(MPTCP_PM_ATTR_ADDR);
    req.put<uint8_t>(MPTCP_PM_ADDR_ATTR_ID, id);
    req.end_nested(nest);
    transact(fd_.get(), req, what);
}

bool MptcpPathManager::renew(const std::string& address) {
    const std::string what = "mptcp_pm: renew " + address;
    const BinaryAddress a = parse_address(address, what);
    const std::string canonical = address_text(a.family, a.bytes);  // as endpoints() writes it
    std::vector<MptcpEndpoint> matching;
    for (auto& e : endpoints())
        if (e.address == canonical) matching.push_back(std::move(e));
    if (auto it = not_readded_.find(canonical); it != not_readded_.end()) {
        // Deleted by an earlier renewal and not re-added: its subflows are gone already.
        std::vector<MptcpEndpoint> left = std::move(it->second);
        not_readded_.erase(it);
        for (const auto& e : left) add_again(e, what);
        return true;
    }
    if (matching.empty()) return false;
    for (const auto& e : matching)
        if (e.flags & MPTCP_PM_ADDR_FLAG_IMPLICIT)
            throw NetlinkError(what + ": endpoint " + to_string(e) +
                                   " was made by the kernel for a subflow (implicit) and cannot "
                                   "be re-added",
                               EINVAL);
    for (const auto& e : matching) {
        remove(e.id);
        add_again(e, what);
    }
    return true;
}

void MptcpPathManager::add_again(const MptcpEndpoint& e, const std::string& what) {
    for (int attempt = 1;; ++attempt) {
        try {
            add(e);
            return;
        } catch (const NetlinkError& err) {
            if (attempt < 5) {
                std::this_thread::sleep_for(std::chrono::milliseconds(10 * attempt));
                continue;
            }
            not_readded_[e.address].push_back(e);
            throw NetlinkError(
                what + ": deleted endpoint " + to_string(e) +
                    " but could not re-add it (the next renewal tries again): " + err.what(),
                err.error);
        }
    }
}

}  // namespace mpsteer::net
