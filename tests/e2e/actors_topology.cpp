// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "actors_topology.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

namespace mpsteer::e2e {

using namespace std::chrono_literals;
using lab::must;
using lab::must_in;

namespace {
std::atomic<int> g_capture_seq{0};

// Checksums validated; the sequence analyses (slow on big captures, irrelevant here) off.
const std::vector<std::string> kDissect = {"-o", "tcp.check_checksum:TRUE",
                                           "-o", "ip.check_checksum:TRUE",
                                           "-o", "tcp.analyze_sequence_numbers:FALSE",
                                           "-o", "mptcp.analyze_mptcp:FALSE"};
}  // namespace

// ---- Capture -------------------------------------------------------------------------------

Capture::Capture(const std::string& netns, const std::string& ifname, const std::string& filter) {
    path_ = "/tmp/mps-actors-" + std::to_string(getpid()) + "-" + std::to_string(g_capture_seq++) +
            ".pcapng";
    std::filesystem::remove(path_);
    std::vector<std::string> argv{"ip", "netns", "exec", netns,  "tshark", "-q",
                                  "-i", ifname,  "-f",   filter, "-w",     path_};
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw lab::Error("capture: fork failed");
    if (pid_ == 0) {
        int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execvp(cargv[0], cargv.data());
        _exit(127);
    }
    // tshark writes the file header once dumpcap is capturing.
    for (int i = 0; i < 100; i++) {
        struct stat st {};
        if (stat(path_.c_str(), &st) == 0 && st.st_size > 0) {
            std::this_thread::sleep_for(200ms);
            return;
        }
        int status;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            throw lab::Error(
                "capture: tshark exited at start (installed? packaging/setup-deps.sh)");
        }
        std::this_thread::sleep_for(50ms);
    }
    stop();
    throw lab::Error("capture: tshark did not start capturing on " + ifname);
}

Capture::~Capture() {
    stop();
    std::error_code ec;
    if (!getenv("MPS_KEEP_PCAP")) std::filesystem::remove(path_, ec);
}

void Capture::stop() {
    if (pid_ <= 0) return;
    std::this_thread::sleep_for(300ms);  // let the last packets reach the file
    kill(pid_, SIGINT);
    for (int i = 0; i < 100; i++) {
        int status;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            return;
        }
        std::this_thread::sleep_for(50ms);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
}

int Capture::count(const std::string& filter) {
    stop();
    std::vector<std::string> argv{"tshark", "-n", "-r", path_};
    argv.insert(argv.end(), kDissect.begin(), kDissect.end());
    argv.insert(argv.end(), {"-Y", filter, "-T", "fields", "-e", "frame.number"});
    auto r = lab::run(argv);
    if (r.status != 0) throw lab::Error("tshark -Y '" + filter + "' failed: " + r.out);
    int n = 0;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);)
        if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) n++;
    return n;
}

std::string Capture::problems(bool checksums) {
    stop();
    std::vector<std::string> argv{"tshark", "-n", "-r", path_};
    argv.insert(argv.end(), kDissect.begin(), kDissect.end());
    // A TCP checksum of 0xffff is how the kernel's own software checksum (skb_checksum_help,
    // CSUM_MANGLED_0) writes a zero: Wireshark flags it, it is not a checksum error. With
    // checksum offload a captured TCP checksum is the pseudo-header's only (IP's is complete).
    argv.insert(argv.end(),
                {"-Y", checksums ? "_ws.malformed || _ws.expert.group == 0x07000000 || "
                                   "ip.checksum.status == 0 || "
                                   "(tcp.checksum.status == 0 && tcp.checksum != 0xffff)"
                                 : "_ws.malformed || ip.checksum.status == 0"});
    auto r = lab::run(argv);
    if (r.status != 0) throw lab::Error("tshark failed: " + r.out);
    std::string out;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);)
        if (line.find("Running as user") == std::string::npos && !line.empty()) out += line + "\n";
    return out;
}

// ---- connect ---------------------------------------------------------------------------------

int connect_error(const std::string& netns, const std::string& addr, uint16_t port,
                  std::chrono::milliseconds timeout) {
    sockaddr_storage ss{};
    socklen_t sl;
    int family;
    if (auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
        inet_pton(AF_INET, addr.c_str(), &a4->sin_addr) == 1) {
        family = a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        sl = sizeof *a4;
    } else {
        auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
        if (inet_pton(AF_INET6, addr.c_str(), &a6->sin6_addr) != 1)
            throw lab::Error("not an address: " + addr);
        family = a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        sl = sizeof *a6;
    }
    int fd;
    {
        lab::NetnsGuard in(netns);
        fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_MPTCP);
    }
    if (fd < 0) throw lab::Error("MPTCP socket: " + std::string(std::strerror(errno)));
    int err = 0;
    if (connect(fd, reinterpret_cast<sockaddr*>(&ss), sl) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            err = ETIMEDOUT;
            if (poll(&p, 1, static_cast<int>(timeout.count())) > 0) {
                socklen_t el = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            }
        }
    }
    close(fd);
    return err;
}

// ---- ss --------------------------------------------------------------------------------------

std::vector<SubflowState> subflow_states(const std::string& netns) {
    std::vector<SubflowState> out;
    std::istringstream in(must_in(netns, {"ss", "-Htni", "state", "established"}));
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        std::istringstream f(line);
        if (line[0] != ' ' && line[0] != '\t') {
            SubflowState s;
            std::string rq, sq;
            f >> rq >> sq >> s.local >> s.remote;
            out.push_back(s);
            continue;
        }
        if (out.empty()) continue;
        std::string prev;
        for (std::string w; f >> w; prev = w) {
            auto num = [&](const char* key, uint64_t& v) {
                if (w.rfind(key, 0) == 0) v = std::stoull(w.substr(std::strlen(key)));
            };
            num("bytes_acked:", out.back().bytes_acked);
            num("bytes_received:", out.back().bytes_received);
            if (prev == "tcp-ulp-mptcp" && w.rfind("flags:", 0) == 0)
                out.back().flags = w.substr(6);
        }
    }
    return out;
}

// ---- three namespaces ------------------------------------------------------------------------

MiddleTopology::MiddleTopology(const std::string& tag, lab::Offloads offloads)
    : prefix_(lab::Lab::kPrefix + tag) {
    if (dev("cm").size() > 15) throw lab::Error("topology tag too long: " + tag);
    lab::Lab::cleanup(prefix_ + "-");
    try {
        const std::string cli = ns("cli"), mid = ns("mid"), srv = ns("srv");
        for (const auto& n : {cli, mid, srv}) {
            must({"ip", "netns", "add", n});
            must({"ip", "-n", n, "link", "set", "lo", "up"});
            must_in(n, {"sysctl", "-q", "-w", "net.mptcp.enabled=1"});
            must_in(n, {"sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0"});
            must_in(n, {"sysctl", "-q", "-w", "net.ipv4.conf.default.rp_filter=0"});
        }
        must_in(mid, {"sysctl", "-q", "-w", "net.ipv4.ip_forward=1"});
        struct Pair {
            std::string ns_a, a, addr_a, ns_b, b, addr_b;
        };
        for (const Pair& p :
             {Pair{cli, dev("cm"), "10.20.0.1/24", mid, dev("mc"), "10.20.0.2/24"},
              Pair{mid, dev("u1"), "10.21.0.1/24", srv, dev("v1"), "10.21.0.2/24"},
              Pair{mid, dev("u2"), "10.22.0.1/24", srv, dev("v2"), "10.22.0.2/24"}}) {
            must({"ip", "link", "add", p.a, "netns", p.ns_a, "type", "veth", "peer", "name", p.b,
                  "netns", p.ns_b});
            for (auto [n, d, a] :
                 {std::tuple{p.ns_a, p.a, p.addr_a}, std::tuple{p.ns_b, p.b, p.addr_b}}) {
                must({"ip", "-n", n, "addr", "add", a, "dev", d});
                lab::set_offloads(n, d, offloads);
                must_in(n, {"sysctl", "-q", "-w", "net.ipv4.conf." + d + ".rp_filter=0"});
                must({"ip", "-n", n, "link", "set", d, "up"});
            }
        }
        must({"ip", "-n", cli, "addr", "add", "10.20.0.3/24", "dev", dev("cm")});
        must({"ip", "-n", cli, "route", "add", "default", "via", "10.20.0.2"});
        must({"ip", "-n", mid, "route", "add", "10.29.0.2/32", "via", "10.21.0.2", "dev", dev("u1"),
              "metric", "10"});
        must({"ip", "-n", mid, "route", "add", "10.29.0.2/32", "via", "10.22.0.2", "dev", dev("u2"),
              "metric", "20"});
        must({"ip", "-n", srv, "addr", "add", "10.29.0.2/32", "dev", "lo"});
        must({"ip", "-n", srv, "route", "add", "10.20.0.0/24", "via", "10.21.0.1"});
        for (const auto& n : {cli, srv})
            must({"ip", "-n", n, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted",
                  "2"});
        must({"ip", "-n", cli, "mptcp", "endpoint", "add", kClient2, "dev", dev("cm"), "subflow"});
    } catch (...) {
        lab::Lab::cleanup(prefix_ + "-");
        throw;
    }
}

MiddleTopology::~MiddleTopology() {
    try {
        lab::Lab::cleanup(prefix_ + "-");
    } catch (...) {}
}

}  // namespace mpsteer::e2e
