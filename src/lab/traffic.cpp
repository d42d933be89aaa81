// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A minimal MPTCP sender and sink: a deterministic byte stream, FNV-1a over what went out and
// what came in, and the kernel's MPTCP_INFO of each socket (token, subflows, fallback).
#include <arpa/inet.h>
#include <linux/mptcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "lab/lab.h"
#include "net/fd.h"

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif
#ifndef SOL_MPTCP
#define SOL_MPTCP 284
#endif

namespace mpsteer::lab {

namespace {

using Clock = std::chrono::steady_clock;

// A position-sensitive hash of a byte stream, eight bytes a step: the same value whatever
// chunks the stream came in. (A byte-wise FNV-1a ran at 0.3-0.6 GB/s here: the lab's sender and
// receiver were bound by their own checksum below the paths' rate.) Little-endian words, as on
// every architecture the project builds for.
class StreamHash {
public:
    void update(const uint8_t* p, size_t n) {
        for (; n && fill_; --n) {  // complete the word the last chunk began
            word_ |= uint64_t(*p++) << (8 * fill_);
            if (++fill_ == 8) {
                h_ = step(h_, word_);
                word_ = 0;
                fill_ = 0;
            }
        }
        for (; n >= 8; n -= 8, p += 8) {
            uint64_t w;
            std::memcpy(&w, p, 8);
            h_ = step(h_, w);
        }
        for (; n; --n) word_ |= uint64_t(*p++) << (8 * fill_++);
    }
    uint64_t value() const { return fill_ ? step(h_, word_ ^ (uint64_t(fill_) << 59)) : h_; }

private:
    static uint64_t step(uint64_t h, uint64_t w) {
        h = (h ^ w) * 0x9e3779b97f4a7c15ull;
        return h ^ (h >> 29);
    }
    uint64_t h_ = 0xcbf29ce484222325ull, word_ = 0;
    unsigned fill_ = 0;
};

// The stream repeats a pseudo-random block whose prime length never lines up with segment,
// window or buffer sizes, so misplaced data changes the checksum.
constexpr size_t kPatternLen = 1048573;
const std::vector<uint8_t>& pattern() {
    static const std::vector<uint8_t> p = [] {
        std::vector<uint8_t> v(kPatternLen);
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (auto& b : v) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b = static_cast<uint8_t>(x >> 32);
        }
        return v;
    }();
    return p;
}

std::string errstr(const std::string& what) {
    return what + ": " + std::strerror(errno);
}

void fill_info(int fd, TrafficStats& s) {
    mptcp_info info{};
    socklen_t len = sizeof info;
    if (getsockopt(fd, SOL_MPTCP, MPTCP_INFO, &info, &len) != 0) {
        s.fallback = true;  // the kernel only answers for live MPTCP connections
        return;
    }
    s.token = info.mptcpi_token;
    s.subflows = info.mptcpi_subflows;
    s.fallback = info.mptcpi_flags & MPTCP_INFO_FLAG_FALLBACK;
}

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An MPTCP listener on `port` (any address) inside `netns`; `who` names it in errors.
net::Fd listen_mptcp(const std::string& netns, uint16_t port, bool ipv6, const std::string& who,
                     int backlog = 4) {
    NetnsGuard in(netns);
    int family = ipv6 ? AF_INET6 : AF_INET;
    net::Fd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_MPTCP));
    if (!fd) throw Error(errstr(who + ": MPTCP socket (net.mptcp.enabled?)"));
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t sl;
    if (ipv6) {
        auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        a->sin6_addr = in6addr_any;
        sl = sizeof *a;
    } else {
        auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        sl = sizeof *a;
    }
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), sl) != 0 || listen(fd.get(), backlog))
        throw Error(errstr(who + ": bind/listen port " + std::to_string(port)));
    return fd;
}

// The one connection a listener takes, polling so that `stop` ends the wait; none when
// stopped or on error (errno set).
net::Fd accept_one(int listen_fd, const std::atomic<bool>& stop) {
    while (!stop) {
        pollfd p{listen_fd, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0)
            return net::Fd(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    }
    return net::Fd();
}

// Reads one message of an exchange (exactly n bytes), polling so that `stop` or the deadline
// ends the wait; `who` names the side in errors.
void read_message(int fd, size_t n, const std::atomic<bool>& stop, Clock::time_point deadline,
                  const std::string& who) {
    std::vector<uint8_t> buf(n);
    for (size_t got = 0; got < n;) {
        if (stop) throw Error(who + ": stopped during the exchange");
        if (Clock::now() > deadline) throw Error(who + ": no message within the timeout");
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        ssize_t r = recv(fd, buf.data() + got, n - got, 0);
        if (r > 0) {
            got += size_t(r);
        } else if (r == 0) {
            throw Error(who + ": the peer closed during the exchange");
        } else if (errno != EINTR) {
            throw Error(errstr(who + ": recv"));
        }
    }
}

// Writes one message of an exchange (n bytes, small enough for any send buffer).
void write_message(int fd, size_t n, const std::string& who) {
    const std::vector<uint8_t> msg(n, 'm');
    for (size_t sent = 0; sent < n;) {
        ssize_t r = send(fd, msg.data() + sent, n - sent, MSG_NOSIGNAL);
        if (r > 0)
            sent += size_t(r);
        else if (r < 0 && errno != EINTR)
            throw Error(errstr(who + ": send"));
    }
}

// The exchange of SendOptions::requests on a connected socket, from the client's side or the
// source's: `requests` client messages, each but the last answered.
void exchange(int fd, int requests, bool client, const std::atomic<bool>& stop,
              Clock::time_point deadline, const std::string& who) {
    for (int i = 0; i < requests; i++) {
        const bool answered = i + 1 < requests;
        if (client) {
            write_message(fd, kRequestBytes, who);
            if (answered) read_message(fd, kRequestBytes, stop, deadline, who);
        } else {
            read_message(fd, kRequestBytes, stop, deadline, who);
            if (answered) write_message(fd, kRequestBytes, who);
        }
    }
}

}  // namespace

// ---- sink ----------------------------------------------------------------------------------

Sink::Sink(const std::string& netns, uint16_t port, bool ipv6)
    : listen_fd_(listen_mptcp(netns, port, ipv6, "sink")) {
    thread_ = std::thread([this] { serve(); });
}

Sink::~Sink() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

void Sink::serve() {
    // Polled, so the destructor can stop a sink that never got its connection.
    net::Fd fd = accept_one(listen_fd_.get(), stop_);
    if (!fd) {
        error_ = stop_ ? "sink: stopped before a connection" : errstr("sink: accept");
        done_ = true;
        return;
    }
    auto t0 = Clock::now();
    StreamHash h;
    std::vector<uint8_t> buf(1 << 18);
    while (!stop_) {
        pollfd p{fd.get(), POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd.get(), buf.data(), buf.size(), 0);
        if (n > 0) {
            h.update(buf.data(), n);
            bytes_ += n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) error_ = errstr("sink: recv");
        break;
    }
    result_.seconds = since(t0);
    result_.bytes = bytes_;
    result_.checksum = h.value();
    fill_info(fd.get(), result_);
    fd.reset();  // closed before done_ releases wait()
    done_ = true;
}

TrafficStats Sink::wait(std::chrono::milliseconds timeout) {
    auto end = Clock::now() + timeout;
    while (!done_ && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done_) throw Error("sink: no end of stream within the timeout");
    thread_.join();
    if (!error_.empty()) throw Error(error_);
    return result_;
}

// ---- sender --------------------------------------------------------------------------------

namespace {
// Sends the deterministic stream on a connected socket until a limit of `opt`, then closes it.
TrafficStats send_on(net::Fd fd, const SendOptions& opt) {
    // A bounded blocking send, so the stop flag and the deadline are checked even when the
    // peer's window is closed.
    timeval tv{0, 100000};
    setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const auto& pat = pattern();
    TrafficStats s;
    StreamHash h;
    auto t0 = Clock::now();
    auto deadline = t0 + opt.duration;
    size_t pos = 0;
    for (;;) {
        if (opt.stop && opt.stop->load()) break;
        if (opt.duration.count() && Clock::now() >= deadline) break;
        size_t chunk = std::min<size_t>(64 * 1024, kPatternLen - pos);
        if (opt.bytes) {
            if (s.bytes >= opt.bytes) break;
            chunk = std::min<uint64_t>(chunk, opt.bytes - s.bytes);
        }
        ssize_t n = send(fd.get(), pat.data() + pos, chunk, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            throw Error(errstr("send"));
        }
        h.update(pat.data() + pos, n);
        s.bytes += n;
        pos = (pos + n) % kPatternLen;
    }
    s.checksum = h.value();
    fill_info(fd.get(), s);
    s.seconds = since(t0);
    shutdown(fd.get(), SHUT_WR);
    fd.reset();  // the kernel delivers what is queued; the receiver's result says when it arrived
    return s;
}

// An MPTCP (or TCP) socket created inside `netns` and connected to addr:port.
net::Fd connect_stream(const std::string& netns, const std::string& addr, uint16_t port,
                       int protocol = IPPROTO_MPTCP) {
    sockaddr_storage ss{};
    socklen_t sl;
    int family;
    if (auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
        inet_pton(AF_INET, addr.c_str(), &a4->sin_addr) == 1) {
        family = a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        sl = sizeof *a4;
    } else if (auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
               inet_pton(AF_INET6, addr.c_str(), &a6->sin6_addr) == 1) {
        family = a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        sl = sizeof *a6;
    } else {
        throw Error("send: not an address: " + addr);
    }

    net::Fd fd;
    {
        NetnsGuard in(netns);
        fd.reset(socket(family, SOCK_STREAM | SOCK_CLOEXEC, protocol));
    }
    if (!fd) throw Error(errstr(protocol == IPPROTO_MPTCP ? "MPTCP socket" : "TCP socket"));
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), sl) != 0)
        throw Error(errstr("connect " + addr + ":" + std::to_string(port)));
    return fd;
}
}  // namespace

TrafficStats send_stream(const std::string& netns, const std::string& addr, uint16_t port,
                         const SendOptions& opt) {
    return send_on(connect_stream(netns, addr, port, opt.plain_tcp ? IPPROTO_TCP : IPPROTO_MPTCP),
                   opt);
}

TrafficStats receive_stream(const std::string& netns, const std::string& addr, uint16_t port,
                            std::chrono::milliseconds timeout,
                            const std::function<void(uint64_t)>& progress, int requests) {
    net::Fd fd = connect_stream(netns, addr, port);
    TrafficStats s;
    StreamHash h;
    auto t0 = Clock::now();
    const std::atomic<bool> never{false};
    exchange(fd.get(), requests, true, never, t0 + timeout, "receive");
    std::vector<uint8_t> buf(1 << 18);
    for (;;) {
        if (Clock::now() - t0 > timeout)
            throw Error("receive: no end of stream within the timeout");
        pollfd p{fd.get(), POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd.get(), buf.data(), buf.size(), 0);
        if (n > 0) {
            h.update(buf.data(), n);
            s.bytes += n;
            if (progress) progress(s.bytes);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw Error(errstr("receive: recv"));
        break;
    }
    s.checksum = h.value();
    s.seconds = since(t0);
    fill_info(fd.get(), s);
    return s;
}

// ---- source --------------------------------------------------------------------------------

Source::Source(const std::string& netns, uint16_t port, const SendOptions& opt, bool ipv6)
    : listen_fd_(listen_mptcp(netns, port, ipv6, "source")) {
    thread_ = std::thread([this, opt] {
        net::Fd fd = accept_one(listen_fd_.get(), stop_);
        if (!fd) {
            error_ = stop_ ? "source: stopped before a connection" : errstr("source: accept");
        } else {
            SendOptions o = opt;
            if (!o.stop) o.stop = &stop_;
            try {
                exchange(fd.get(), o.requests, false, *o.stop,
                         Clock::now() + std::chrono::seconds(30), "source");
                result_ = send_on(std::move(fd), o);  // closes it
            } catch (const std::exception& e) {
                error_ = e.what();
            }
        }
        fd.reset();  // closed before done_ releases wait()
        done_ = true;
    });
}

Source::~Source() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

TrafficStats Source::wait(std::chrono::milliseconds timeout) {
    auto end = Clock::now() + timeout;
    while (!done_ && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done_) throw Error("source: not done within the timeout");
    thread_.join();
    if (!error_.empty()) throw Error(error_);
    return result_;
}

// ---- interactive ---------------------------------------------------------------------------

Echo::Echo(const std::string& netns, uint16_t port, bool ipv6)
    : listen_fd_(listen_mptcp(netns, port, ipv6, "echo")) {
    thread_ = std::thread([this] {
        net::Fd fd = accept_one(listen_fd_.get(), stop_);
        std::vector<uint8_t> buf(kRequestBytes);
        // Whole messages back, until the client closes (or the destructor stops it).
        for (size_t got = 0; fd && !stop_;) {
            pollfd p{fd.get(), POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            ssize_t r = recv(fd.get(), buf.data() + got, buf.size() - got, 0);
            if (r <= 0 && !(r < 0 && errno == EINTR)) break;
            if (r > 0) got += size_t(r);
            if (got < buf.size()) continue;
            got = 0;
            try {
                write_message(fd.get(), kRequestBytes, "echo");
            } catch (const std::exception&) {
                break;
            }
        }
    });
}

Echo::~Echo() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

std::vector<Exchange> interactive_stream(const std::string& netns, const std::string& addr,
                                         uint16_t port, std::chrono::milliseconds duration,
                                         std::chrono::milliseconds every, bool* fallback) {
    net::Fd fd = connect_stream(netns, addr, port);
    std::vector<Exchange> replies;
    const std::atomic<bool> never{false};
    const auto t0 = Clock::now(), end = t0 + duration;
    for (auto next = t0; next < end; next += every) {
        std::this_thread::sleep_until(next);
        const auto sent = Clock::now();
        write_message(fd.get(), kRequestBytes, "interactive");
        read_message(fd.get(), kRequestBytes, never, end + std::chrono::seconds(60), "interactive");
        replies.push_back({sent, Clock::now()});
        while (next + every < replies.back().replied) next += every;  // a late reply skips slots
    }
    if (fallback) {
        TrafficStats s;
        fill_info(fd.get(), s);
        *fallback = s.fallback;
    }
    return replies;
}

// ---- many connections ----------------------------------------------------------------------

Discard::Discard(const std::string& netns, uint16_t port, bool ipv6)
    : listen_fd_(listen_mptcp(netns, port, ipv6, "discard", 1024)) {
    thread_ = std::thread([this] { serve(); });
}

Discard::~Discard() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

void Discard::serve() {
    std::vector<pollfd> fds{{listen_fd_.get(), POLLIN, 0}};
    std::vector<net::Fd> conns;  // owns fds[1...], in the same order
    std::vector<uint8_t> buf(1 << 16);
    while (!stop_) {
        if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
        for (size_t i = 1; i < fds.size(); i++) {
            if (!fds[i].revents) continue;
            ssize_t n = recv(fds[i].fd, buf.data(), buf.size(), MSG_DONTWAIT);
            if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) continue;
            conns[i - 1].reset();  // the end of the stream, or a reset
            fds[i].fd = -1;
        }
        std::erase_if(fds, [](const pollfd& p) { return p.fd < 0; });
        std::erase_if(conns, [](const net::Fd& c) { return !c; });
        if (fds[0].revents & POLLIN) {
            net::Fd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
            if (fd) {
                fds.push_back({fd.get(), POLLIN, 0});
                conns.push_back(std::move(fd));
                accepted_++;
            }
        }
    }
}

ConnectionSet::ConnectionSet(const std::string& netns, const std::string& addr, uint16_t port,
                             unsigned count) {
    for (unsigned i = 0; i < count; i++) {
        fds_.push_back(connect_stream(netns, addr, port));
        errors_.push_back(0);
    }
}

void ConnectionSet::send_each(size_t bytes) {
    const auto& pat = pattern();
    bytes = std::min(bytes, pat.size());
    for (size_t i = 0; i < fds_.size(); i++) {
        if (errors_[i]) continue;
        if (send(fds_[i].get(), pat.data(), bytes, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
            errno != EAGAIN && errno != EINTR)
            errors_[i] = errno;
    }
}

std::vector<ConnectionSet::State> ConnectionSet::states() {
    std::vector<State> out;
    for (size_t i = 0; i < fds_.size(); i++) {
        State st;
        sockaddr_storage local{};
        socklen_t len = sizeof local;
        if (getsockname(fds_[i].get(), reinterpret_cast<sockaddr*>(&local), &len) == 0)
            st.local_port = ntohs(local.ss_family == AF_INET6
                                      ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                      : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
        TrafficStats info;
        fill_info(fds_[i].get(), info);
        st.subflows = info.subflows;
        st.fallback = info.fallback;
        int err = 0;
        len = sizeof err;
        getsockopt(fds_[i].get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err && !errors_[i]) errors_[i] = err;
        st.error = errors_[i];
        // The peer never sends: anything readable is its FIN or a reset.
        char byte;
        ssize_t n = recv(fds_[i].get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        st.closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
        if (n < 0 && st.closed && !st.error) st.error = errno;
        out.push_back(st);
    }
    return out;
}

}  // namespace mpsteer::lab
