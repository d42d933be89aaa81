// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A delay line: an L2 relay between two interfaces of one namespace that holds every frame
// for a fixed time before forwarding it. Stands in for `tc netem delay` on kernels built
// without sch_netem (this one: CONFIG_NET_SCH_NETEM is not set). The frames keep their
// offload state through the relay (PACKET_VNET_HDR: a GSO super-packet stays one, a partial
// checksum stays partial), so the hosts on either side offload as they would on a wire.
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include <spdlog/spdlog.h>

#include "lab/lab.h"
#include "net/fd.h"

namespace mpsteer::lab {

namespace {

using Clock = std::chrono::steady_clock;

net::Fd packet_socket(const std::string& ifname) {
    net::Fd fd(socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, htons(ETH_P_ALL)));
    if (!fd) throw Error(std::string("delay line: packet socket: ") + std::strerror(errno));
    sockaddr_ll a{};
    a.sll_family = AF_PACKET;
    a.sll_protocol = htons(ETH_P_ALL);
    a.sll_ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
    int one = 1, big = 8 << 20;
    // Our own transmissions on this interface must not come back as input.
    setsockopt(fd.get(), SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    // Each frame with its virtio_net_hdr: received and sent as is, GSO and checksum state.
    if (setsockopt(fd.get(), SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0)
        throw Error(std::string("delay line: PACKET_VNET_HDR: ") + std::strerror(errno));
    // Deep buffers: a burst at line rate must wait out the delay rather than be dropped.
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
    setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
    if (!a.sll_ifindex || bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        throw Error("delay line: bind to " + ifname + ": " + std::strerror(errno));
    return fd;
}

struct Frame {
    Clock::time_point due;
    std::vector<uint8_t> data;
};

}  // namespace

DelayLine::DelayLine(const std::string& netns, const std::string& if_a, const std::string& if_b,
                     std::chrono::microseconds delay)
    : delay_us_(delay.count()) {
    NetnsGuard in(netns);
    fd_[0] = packet_socket(if_a);
    fd_[1] = packet_socket(if_b);
    thread_ = std::thread([this] { relay(); });
}

DelayLine::~DelayLine() {
    stop_ = true;
    thread_.join();
}

void DelayLine::relay() {
    // One FIFO per direction: a constant delay keeps frames in arrival order.
    std::deque<Frame> q[2];
    // struct virtio_net_hdr (10 bytes; linux/virtio_net.h does not compile as C++), then a
    // frame of up to 64 KiB (a GSO super-packet).
    std::vector<uint8_t> buf(10 + ETH_HLEN + 65536);
    while (!stop_) {
        auto now = Clock::now();
        // Sleep until the next frame is due (at most 50 ms, to notice stop_).
        auto wake = now + std::chrono::milliseconds(50);
        for (auto& d : q)
            if (!d.empty() && d.front().due < wake) wake = d.front().due;
        auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now);
        timespec ts{0, 0};
        if (wait.count() > 0) {
            ts.tv_sec = wait.count() / 1000000000;
            ts.tv_nsec = wait.count() % 1000000000;
        }
        pollfd p[2] = {{fd_[0].get(), POLLIN, 0}, {fd_[1].get(), POLLIN, 0}};
        ppoll(p, 2, &ts, nullptr);
        now = Clock::now();
        const auto delay = std::chrono::microseconds(delay_us_.load());
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & POLLIN)) continue;
            for (;;) {
                ssize_t n = recv(fd_[i].get(), buf.data(), buf.size(), MSG_DONTWAIT);
                if (n <= 0) break;
                if (blackhole_.load(std::memory_order_relaxed)) continue;
                q[i].push_back({now + delay, {buf.begin(), buf.begin() + n}});
            }
        }
        for (int i = 0; i < 2; i++) {
            while (!q[i].empty() && q[i].front().due <= now) {
                const auto& f = q[i].front();
                // Out of the other interface; a full queue drops, as a router would.
                if (send(fd_[i ^ 1].get(), f.data.data(), f.data.size(), MSG_DONTWAIT) < 0)
                    dropped_++;
                q[i].pop_front();
            }
        }
    }
}

}  // namespace mpsteer::lab
