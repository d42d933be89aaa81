// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lua/datapath_backend.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/inet_diag.h>
#include <linux/mptcp.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "net/address.h"
#include "net/fd.h"

namespace mpsteer::lua {
namespace {

// (address bytes, port) of both ends, the smaller first.
std::string pair_key(uint8_t family, const uint32_t* a, uint16_t pa, const uint32_t* b,
                     uint16_t pb) {
    auto one = [](const uint32_t* x, uint16_t p) {
        std::string s(reinterpret_cast<const char*>(x), 16);
        s.push_back(char(p >> 8));
        s.push_back(char(p & 0xff));
        return s;
    };
    std::string x = one(a, pa), y = one(b, pb);
    if (y < x) std::swap(x, y);
    return std::string(1, char(family)) + x + y;
}

}  // namespace

std::string canonical_pair(const mps_flow_key& k) {
    return pair_key(k.family, k.a, k.port_a, k.b, k.port_b);
}

std::map<std::string, TcpInfo> tcp_sockets() {
    std::map<std::string, TcpInfo> out;
    const net::Fd sock(socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    const int fd = sock.get();
    if (fd < 0) throw std::runtime_error(std::string("sock_diag: ") + std::strerror(errno));
    for (int family : {AF_INET, AF_INET6}) {
        struct {
            nlmsghdr nh;
            inet_diag_req_v2 r;
        } req{};
        req.nh.nlmsg_len = sizeof req;
        req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
        req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
        req.r.sdiag_family = uint8_t(family);
        req.r.sdiag_protocol = IPPROTO_TCP;
        req.r.idiag_ext = 1u << (INET_DIAG_INFO - 1);
        req.r.idiag_states = 1u << 1 /* TCP_ESTABLISHED */;
        if (send(fd, &req, sizeof req, 0) < 0)
            throw std::runtime_error(std::string("sock_diag: ") + std::strerror(errno));
        alignas(nlmsghdr) char buf[32768];
        bool done = false;
        while (!done) {
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, size_t(n));
                 h = NLMSG_NEXT(h, n)) {
                if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
                    done = true;
                    break;
                }
                auto* m = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
                int len = int(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
                TcpInfo ti;
                bool have = false;
                for (auto* a = reinterpret_cast<rtattr*>(m + 1); RTA_OK(a, len);
                     a = RTA_NEXT(a, len)) {
                    if (a->rta_type != INET_DIAG_INFO) continue;
                    tcp_info t{};
                    std::memcpy(&t, RTA_DATA(a), std::min<size_t>(RTA_PAYLOAD(a), sizeof t));
                    ti.srtt_us = t.tcpi_rtt;
                    ti.rttvar_us = t.tcpi_rttvar;
                    ti.cwnd_bytes = uint64_t(t.tcpi_snd_cwnd) * t.tcpi_snd_mss;
                    int64_t pk =
                        int64_t(t.tcpi_unacked) - t.tcpi_sacked - t.tcpi_lost + t.tcpi_retrans;
                    ti.inflight_bytes = uint64_t(std::max<int64_t>(0, pk)) * t.tcpi_snd_mss;
                    ti.notsent_bytes = t.tcpi_notsent_bytes;
                    ti.delivery_rate = t.tcpi_delivery_rate;
                    ti.bytes_acked = t.tcpi_bytes_acked;
                    ti.bytes_received = t.tcpi_bytes_received;
                    ti.last_data_recv_ms = t.tcpi_last_data_recv;
                    ti.last_ack_recv_ms = t.tcpi_last_ack_recv;
                    have = true;
                }
                if (!have) continue;
                uint32_t src[4] = {}, dst[4] = {};
                std::memcpy(src, m->id.idiag_src, family == AF_INET ? 4 : 16);
                std::memcpy(dst, m->id.idiag_dst, family == AF_INET ? 4 : 16);
                ti.local_address = net::address_text(family == AF_INET ? 4 : 6, src);
                out[pair_key(family == AF_INET ? 4 : 6, src, ntohs(m->id.idiag_sport), dst,
                             ntohs(m->id.idiag_dport))] = ti;
            }
        }
    }
    return out;
}

DatapathBackend::DatapathBackend(const datapath::StateMaps& state, FlowIds& ids,
                                 StepWriteQueue& step_writes)
    : state_(state),
      actors_(datapath::ActorMaps::of(state)),
      ids_(ids),
      step_writes_(step_writes) {}

std::vector<Connection> DatapathBackend::read(std::optional<uint32_t> only) {
    // Hooks ask every tick; an idle host has no connections, and finding that out walks every
    // bucket of the table. Skipped while nothing was inserted since a walk found it empty.
    const uint64_t inserts = datapath::conn_inserts();
    if (empty_at_inserts_ == inserts) return {};
    std::map<uint32_t, Connection> conns;
    uint32_t key = 0, next = 0;
    const uint32_t* prev = nullptr;
    while (bpf_map_get_next_key(state_.conns(), prev, &next) == 0) {
        mps_conn c{};
        if (bpf_map_lookup_elem(state_.conns(), &next, &c) == 0 && c.token[0] == next &&
            (!only || *only == next)) {
            Connection& cn = conns[next];
            cn.token = c.token[0];
            cn.token_b = c.token[1];
            cn.bytes = c.bytes;
            cn.packets = c.packets;
        }
        key = next;
        prev = &key;
    }
    if (!only) empty_at_inserts_ = conns.empty() ? std::optional(inserts) : std::nullopt;
    bool live = false;  // some connection has a subflow not closed
    if (!conns.empty()) {
        mps_flow_key fk{}, fnext{};
        const mps_flow_key* fprev = nullptr;
        while (bpf_map_get_next_key(state_.flows(), fprev, &fnext) == 0) {
            mps_flow f{};
            if (bpf_map_lookup_elem(state_.flows(), &fnext, &f) == 0 && f.conn_token) {
                auto it = conns.find(f.conn_token);
                if (it != conns.end()) {
                    // The entry has the flow's counters as of its last tick (abi.h).
                    it->second.packets += MPS_FLOW_PACKETS(&f) - f.conn_packets;
                    it->second.bytes += MPS_FLOW_BYTES(&f) - f.conn_bytes;
                    it->second.subflows.push_back(make_subflow(ids_, fnext, f));
                    live |= !(f.ended & MPS_FLOW_CLOSED);
                }
            }
            fk = fnext;
            fprev = &fk;
        }
    }
    // Entries outlive their connections (the LRU reclaims them): a new connection is a new
    // entry, so none live now stays so until the next insert.
    if (!only) idle_at_inserts_ = live ? std::nullopt : std::optional(inserts);
    std::vector<Connection> out;
    for (auto& [t, c] : conns) {
        std::sort(c.subflows.begin(), c.subflows.end(),
                  [](const Subflow& x, const Subflow& y) { return x.id < y.id; });
        out.push_back(std::move(c));
    }
    overlay_tcp_info(out);
    return out;
}

void DatapathBackend::overlay_tcp_info(std::vector<Connection>& conns) {
    if (conns.empty()) return;
    auto socks = tcp_sockets();
    for (auto& c : conns) {
        uint64_t notsent = 0;
        for (auto& s : c.subflows) {
            auto k = ids_.key_of(s.id);
            if (!k) continue;
            auto it = socks.find(canonical_pair(*k));
            if (it == socks.end()) continue;
            const TcpInfo& t = it->second;
            s.local = true;
            s.srtt_us = t.srtt_us;
            s.rttvar_us = t.rttvar_us;
            s.cwnd = t.cwnd_bytes;
            s.inflight = t.inflight_bytes;
            s.notsent = t.notsent_bytes;
            s.delivery_rate = t.delivery_rate;
            s.local_address = t.local_address;
            s.bytes_received = t.bytes_received;
            s.last_recv_ms = t.last_data_recv_ms;
            s.last_ack_ms = t.last_ack_recv_ms;
            notsent += t.notsent_bytes;
        }
        c.unsent = notsent;
    }
}

std::vector<Connection> DatapathBackend::connections() {
    return read(std::nullopt);
}

std::optional<Connection> DatapathBackend::connection(uint32_t token) {
    mps_conn c{};
    if (bpf_map_lookup_elem(state_.conns(), &token, &c) != 0) return std::nullopt;
    auto v = read(c.token[0]);
    if (v.empty()) return std::nullopt;
    return v.front();
}

std::optional<Subflow> DatapathBackend::subflow(uint64_t id) {
    auto k = ids_.key_of(id);
    if (!k) return std::nullopt;
    mps_flow f{};
    if (bpf_map_lookup_elem(state_.flows(), &*k, &f) != 0) return std::nullopt;
    return make_subflow(ids_, *k, f);
}

bool DatapathBackend::set_subflow(const std::string&, uint64_t id, const SubflowSettings& s) {
    auto k = ids_.key_of(id);
    if (!k) return false;
    if (s.backup)
        throw std::runtime_error(
            "backup: per-subflow MP_PRIO from scripts is not wired to the datapath yet "
            "(use a set_backup action)");
    if (s.rate) {
        mps_ctl_flow_req req{};
        req.key = *k;
        req.set = MPS_CTL_RATE;
        // The manifest's range; 0 clears the override.
        req.rate_bps = *s.rate ? std::clamp<uint64_t>(*s.rate, MPS_RATE_MIN, MPS_RATE_MAX) : 0;
        return state_.update_flow(req);
    }
    return true;
}

namespace {
template <typename F>
bool each_announcement(datapath::ActorMaps& actors, const datapath::StateMaps& state,
                       uint32_t token, uint8_t addr_id, F&& f) {
    bool any = false;
    for (const auto& a : actors.announcements()) {
        if (a.key.addr_id != addr_id) continue;
        uint32_t t = a.value.conn_token;
        mps_flow fl{};
        if (bpf_map_lookup_elem(state.flows(), &a.key.flow, &fl) == 0 && fl.conn_token)
            t = fl.conn_token;
        if (t != token) continue;
        any |= f(a);
    }
    return any;
}
}  // namespace

bool DatapathBackend::add_subflow(const std::string&, uint32_t token, uint8_t addr_id) {
    return each_announcement(actors_, state_, token, addr_id, [&](const datapath::Announcement& a) {
        return actors_.request_add_subflow(a.key);
    });
}

bool DatapathBackend::block_address(const std::string&, uint32_t token, uint8_t addr_id) {
    return each_announcement(actors_, state_, token, addr_id, [&](const datapath::Announcement& a) {
        actors_.block_again(a.key);
        return true;
    });
}

net::MptcpPathManager& DatapathBackend::path_manager() {
    if (!pm_) pm_ = std::make_unique<net::MptcpPathManager>();
    return *pm_;
}

std::vector<Endpoint> DatapathBackend::endpoints() {
    std::vector<Endpoint> out;
    for (const auto& e : path_manager().endpoints()) {
        char name[IF_NAMESIZE] = {};
        Endpoint x;
        x.id = e.id;
        x.address = e.address;
        if (e.ifindex > 0 && if_indextoname(unsigned(e.ifindex), name)) x.interface = name;
        x.subflow = e.flags & MPTCP_PM_ADDR_FLAG_SUBFLOW;
        x.signal = e.flags & MPTCP_PM_ADDR_FLAG_SIGNAL;
        x.backup = e.flags & MPTCP_PM_ADDR_FLAG_BACKUP;
        out.push_back(std::move(x));
    }
    return out;
}

bool DatapathBackend::renew_endpoint(const std::string& policy, const std::string& address) {
    const auto now = std::chrono::steady_clock::now();
    auto known = renewals_.find(address);
    if (known != renewals_.end() && now - known->second.last_at < kRenewGap) {
        ++known->second.refused;
        return false;
    }
    if (!path_manager().renew(address)) return false;  // no endpoint: nothing recorded
    Renewals& r = renewals_[address];
    ++r.done;
    r.last_policy = policy;
    r.last_at = now;
    r.last_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    return true;
}

nlohmann::json DatapathBackend::paths_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [address, r] : renewals_)
        out.push_back({{"address", address},
                       {"renewals", r.done},
                       {"refused", r.refused},
                       {"last_policy", r.last_policy},
                       {"last_unix_ms", r.last_unix_ms}});
    return out;
}

int DatapathBackend::set_policy_backup(const std::string& policy, bool backup) {
    if (!running_) throw std::runtime_error("set_policy_backup: no generation is running");
    const auto& c = running_->chains;
    auto it = std::find(c.policies.begin(), c.policies.end(), policy);
    if (it == c.policies.end()) throw std::runtime_error("set_policy_backup: policy not running");
    const auto idx = uint16_t(it - c.policies.begin());
    std::vector<StepWrite> writes;
    for (uint32_t pc = 0; pc < c.steps.size(); ++pc)
        if (c.steps[pc].prog == MPS_ACT_SET_BACKUP && c.steps[pc].policy == idx)
            writes.push_back({running_->number, pc, backup});
    if (writes.empty())
        throw std::runtime_error("set_policy_backup: policy " + policy +
                                 " has no set_backup action");
    const int n = int(writes.size());
    step_writes_.push(std::move(writes));
    return n;
}

}  // namespace mpsteer::lua
