// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lab/token_balancer.h"

#include <arpa/inet.h>
#include <net/if.h>

#include <chrono>
#include <cstring>
#include <sys/socket.h>
#include <nlohmann/json.hpp>

#include "datapath/datapath.h"

namespace mpsteer::lab {

namespace {

// An interface's MAC and index inside a namespace.
std::pair<lb::Mac, uint32_t> link_of(const std::string& netns, const std::string& ifname) {
    const auto j = nlohmann::json::parse(must({"ip", "-n", netns, "-j", "link", "show", ifname}));
    if (!j.is_array() || j.empty()) throw Error("lab: no interface " + ifname + " in " + netns);
    lb::Mac mac{};
    const std::string text = j[0].value("address", "");
    unsigned v[6];
    if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) !=
        6)
        throw Error("lab: no MAC address on " + ifname + " in " + netns);
    for (int i = 0; i < 6; ++i) mac[i] = static_cast<uint8_t>(v[i]);
    return {mac, j[0].value("ifindex", 0u)};
}

lb::Service service_of(int family, uint16_t port, mps_lb_unknown_action unknown) {
    lb::Service s;
    s.family = static_cast<uint8_t>(family);
    inet_pton(family == 6 ? AF_INET6 : AF_INET, LoadBalancerLab::vip(family).c_str(),
              s.addr.data());
    s.port = port;
    s.unknown_token = unknown;
    return s;
}

uint32_t sum16(const uint8_t* p, size_t n, uint32_t s = 0) {
    for (size_t i = 0; i + 1 < n; i += 2) s += uint32_t(p[i]) << 8 | p[i + 1];
    if (n & 1) s += uint32_t(p[n - 1]) << 8;
    return s;
}

}  // namespace

void send_join_syn(const std::string& netns, int family, const std::string& src, uint16_t sport,
                   const std::string& dst, uint16_t dport, uint32_t token) {
    const int af = family == 6 ? AF_INET6 : AF_INET;
    const size_t alen = family == 6 ? 16 : 4;
    uint8_t sa[16]{}, da[16]{};
    if (inet_pton(af, src.c_str(), sa) != 1 || inet_pton(af, dst.c_str(), da) != 1)
        throw Error("send_join_syn: not IPv" + std::to_string(family) + ": " + src + ", " + dst);
    // TCP header (20) + MP_JOIN SYN (12: kind 30, length 12, subtype 1, address id 1, token,
    // nonce), SYN, window 64240.
    uint8_t tcp[32]{};
    tcp[0] = sport >> 8, tcp[1] = sport & 0xff, tcp[2] = dport >> 8, tcp[3] = dport & 0xff;
    tcp[4] = 0x12, tcp[5] = 0x34;  // sequence number
    tcp[12] = 8 << 4;              // 32 bytes of header
    tcp[13] = 0x02;
    tcp[14] = 0xfa, tcp[15] = 0xf0;
    const uint8_t opt[12] = {30,
                             12,
                             0x10,
                             1,
                             uint8_t(token >> 24),
                             uint8_t(token >> 16),
                             uint8_t(token >> 8),
                             uint8_t(token),
                             1,
                             2,
                             3,
                             4};
    std::memcpy(tcp + 20, opt, sizeof opt);
    // Pseudo-header: addresses, protocol 6, length 32.
    uint32_t s = sum16(sa, alen, sum16(da, alen)) + 6 + sizeof tcp;
    s = sum16(tcp, sizeof tcp, s);
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    const uint16_t check = static_cast<uint16_t>(~s);
    tcp[16] = check >> 8, tcp[17] = check & 0xff;

    NetnsGuard in(netns);
    net::Fd fd(socket(af, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_TCP));
    if (!fd) throw Error(std::string("send_join_syn: raw socket: ") + std::strerror(errno));
    sockaddr_storage from{}, to{};
    socklen_t len;
    if (family == 6) {
        auto* f6 = reinterpret_cast<sockaddr_in6*>(&from);
        auto* t6 = reinterpret_cast<sockaddr_in6*>(&to);
        f6->sin6_family = t6->sin6_family = AF_INET6;
        std::memcpy(&f6->sin6_addr, sa, 16);
        std::memcpy(&t6->sin6_addr, da, 16);
        len = sizeof(sockaddr_in6);
    } else {
        auto* f4 = reinterpret_cast<sockaddr_in*>(&from);
        auto* t4 = reinterpret_cast<sockaddr_in*>(&to);
        f4->sin_family = t4->sin_family = AF_INET;
        std::memcpy(&f4->sin_addr, sa, 4);
        std::memcpy(&t4->sin_addr, da, 4);
        len = sizeof(sockaddr_in);
    }
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&from), len) ||
        sendto(fd.get(), tcp, sizeof tcp, 0, reinterpret_cast<sockaddr*>(&to), len) !=
            static_cast<ssize_t>(sizeof tcp))
        throw Error(std::string("send_join_syn: ") + std::strerror(errno));
}

TokenBalancer::TokenBalancer(const LoadBalancerLab& lab, uint16_t port, int serving,
                             mps_lb_unknown_action unknown)
    : lab_(lab) {
    // A frame from a wire carries a complete checksum; one from a veth whose sender offloads
    // it carries only the pseudo-header's, which the skb's metadata completes and an XDP
    // redirect drops: the client's veths checksum their own frames, as a NIC's peer would.
    for (int p = 1; p <= 2; ++p)
        must_in(lab.client_ns(), {"ethtool", "-K", lab.client_if(p), "tx", "off"});
    balancer_.set_services({service_of(4, port, unknown), service_of(6, port, unknown)});
    set_backends(serving);
    // A veth takes XDP-redirected frames only while its peer runs an XDP program.
    for (int b = 1; b <= lab.backends(); ++b) {
        NetnsGuard in(lab.backend_ns(b));
        peer_links_.push_back(datapath::HookLink::attach(lab.backend_if(b), datapath::Hook::xdp,
                                                         balancer_.veth_peer_prog_fd()));
    }
    {
        NetnsGuard in(lab.router_ns());
        for (int p = 1; p <= 2; ++p) {
            links_.push_back(datapath::HookLink::attach(lab.router_client_if(p),
                                                        datapath::Hook::xdp, balancer_.prog_fd()));
            mode_ = links_.back()->mode();
        }
    }
    learner_ = std::thread([this] {
        while (!stop_) balancer_.learn(std::chrono::milliseconds(50));
    });
}

TokenBalancer::~TokenBalancer() {
    stop_ = true;
    learner_.join();
    links_.clear();  // closing a link detaches it, in whichever namespace
    peer_links_.clear();
}

void TokenBalancer::set_backends(int serving, const std::vector<int>& draining) {
    std::vector<lb::Target> targets;
    for (int b = 1; b <= serving; ++b) {
        lb::Target t;
        t.backend.name = "backend-" + std::to_string(b);
        t.backend.draining = std::find(draining.begin(), draining.end(), b) != draining.end();
        t.mac = link_of(lab_.backend_ns(b), lab_.backend_if(b)).first;
        std::tie(t.src_mac, t.ifindex) = link_of(lab_.router_ns(), lab_.router_backend_if(b));
        targets.push_back(t);
    }
    std::lock_guard lock(mu_);
    balancer_.set_backends(targets);
}

lb::Counters TokenBalancer::counters() const {
    std::lock_guard lock(mu_);
    return balancer_.counters();
}

int TokenBalancer::owner_of(uint32_t token) const {
    std::lock_guard lock(mu_);
    const int index = balancer_.owner_of(token);
    for (int b = 1; b <= lab_.backends(); ++b)
        if (index >= 0 && balancer_.index_of("backend-" + std::to_string(b)) == index) return b;
    return 0;
}

}  // namespace mpsteer::lab
