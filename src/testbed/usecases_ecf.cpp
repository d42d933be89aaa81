// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Use case "ECF scheduling": policies/ecf-scheduler.yaml with lua/ecf.lua on the sender (ECF,
// Lim et al., CoNEXT 2017, as per-subflow rates) against the kernel's default scheduler, in
// the regimes where waiting for the fast path should pay (heterogeneous paths as WiFi + LTE,
// finite transfers, a small receive buffer) and where it cannot (an application-limited
// stream, bulk on symmetric paths).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

#include "testbed/agent_process.h"
#include "testbed/usecases.h"
#include "lab/lab.h"
#include "net/fd.h"
#include "net/stats.h"

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

namespace mpsteer::cli::usecases {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;
using mpsteer::net::Fd;
using mpsteer::net::quantile;
using Clock = std::chrono::steady_clock;

// WiFi-like path 1 and LTE-like path 2 (RTT 20 ms / 80 ms, 50 / 10 Mbit/s); the symmetric
// regime gives path 2 path 1's shape.
constexpr PathShape kWifi{10, 50000};
constexpr PathShape kLte{40, 10000};
// The receiver's constrained tcp_rmem (max 256 KiB: about twice the fast path's
// bandwidth-delay product, far below what both paths need at the slow one's RTT).
constexpr const char* kRmemSmall = "4096 131072 262144";
// The application-limited stream: 16 KiB every 10 ms (13 Mbit/s, a quarter of path 1).
constexpr size_t kChunk = 16 * 1024;
constexpr auto kChunkPeriod = 10ms;
constexpr auto kStreamTime = 5s;
constexpr auto kBulkTime = 5s;
const std::vector<uint64_t> kSizes = {1'000'000, 2'000'000, 4'000'000, 8'000'000};

enum class Kind { transfers, stream, bulk };
struct Regime {
    const char* key;
    const char* label;
    Kind kind;
    bool symmetric;   // path 2 shaped as path 1
    bool small_rmem;  // the receiver's tcp_rmem constrained
    bool realistic;   // counts for the +15 % target
};
const Regime kRegimes[] = {
    {"hetero", "WiFi+LTE, finite transfers", Kind::transfers, false, false, true},
    {"hetero_rmem", "WiFi+LTE, finite transfers, rmem 256 KiB", Kind::transfers, false, true, true},
    {"app_limited", "WiFi+LTE, 13 Mbit/s stream", Kind::stream, false, false, true},
    {"symmetric_bulk", "symmetric 20 ms / 50 Mbit/s, bulk", Kind::bulk, true, false, false},
};

// What the runs of one mode measured, per regime.
struct Samples {
    std::map<std::string, std::map<uint64_t, std::vector<double>>> completion_s;  // regime, size
    std::map<std::string, std::vector<double>> chunk_latency_ms;                  // regime
    std::map<std::string, std::vector<double>> bulk_mbit;                         // regime
    Plot::Series path_rate[2];  // one 8 MB transfer: goodput per path over time
};

void set_rmem(const Lab& lab, const std::string& rmem) {
    must_in(lab.server_ns(), {"sysctl", "-qw", "net.ipv4.tcp_rmem=" + rmem});
}

// Bytes acknowledged per path on the client's subflows to `port` (the server's port).
std::array<uint64_t, 2> acked_per_path(const Lab& lab, uint16_t port) {
    std::array<uint64_t, 2> b{};
    const std::string suffix = ":" + std::to_string(port);
    for (const auto& sf : tcp_subflows(lab.client_ns())) {
        if (!sf.remote.ends_with(suffix)) continue;
        for (int p = 1; p <= 2; p++)
            if (sf.local.starts_with(Lab::client_addr(p) + ":")) b[p - 1] += sf.bytes_acked;
    }
    return b;
}

// One upload of `bytes` over a new connection: seconds from connect to the sink's end of
// stream. With `rates`, each path's goodput every 100 ms goes into it.
double transfer(const Lab& lab, uint16_t port, uint64_t bytes, Plot::Series* rates = nullptr) {
    Sink sink(lab.server_ns(), port);
    const auto t0 = Clock::now();
    std::thread sender([&] {
        send_stream(lab.client_ns(), Lab::server_addr(1), port, SendOptions::of_bytes(bytes));
    });
    std::atomic<bool> done{false};
    std::thread sampler;
    if (rates)
        sampler = std::thread([&] {
            std::array<uint64_t, 2> last{};
            for (auto at = Clock::now(); !done;) {
                at += 100ms;
                std::this_thread::sleep_until(at);
                const auto now = acked_per_path(lab, port);
                const double t = std::chrono::duration<double>(at - t0).count();
                for (int p = 0; p < 2; p++) {
                    rates[p].x.push_back(t);
                    rates[p].y.push_back(double(now[p] - std::min(now[p], last[p])) * 8 / 0.1 /
                                         1e6);
                }
                last = now;
            }
        });
    const auto got = sink.wait(60s);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    done = true;
    sender.join();
    if (sampler.joinable()) sampler.join();
    if (got.bytes != bytes) throw Error("ecf: sink got " + std::to_string(got.bytes) + " bytes");
    return s;
}

// An IPv4 MPTCP socket in `netns` (the calling thread stays where it was).
Fd mptcp_socket(const std::string& netns) {
    NetnsGuard in(netns);
    Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_MPTCP));
    if (!fd) throw Error("ecf: MPTCP socket");
    return fd;
}

sockaddr_in server_sockaddr(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, Lab::server_addr(1).c_str(), &a.sin_addr);
    return a;
}

// The application-limited stream: one chunk every period for kStreamTime; per chunk, the
// milliseconds from its scheduled write to its last byte read at the receiver.
std::vector<double> paced_stream(const Lab& lab, uint16_t port) {
    const Fd lfd = mptcp_socket(lab.server_ns());
    const int one = 1;
    setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_port = htons(port);
    if (bind(lfd.get(), reinterpret_cast<sockaddr*>(&any), sizeof any) || listen(lfd.get(), 1))
        throw Error("ecf: stream listener on port " + std::to_string(port));
    const size_t chunks = kStreamTime / kChunkPeriod;
    std::vector<Clock::time_point> arrived;
    std::thread receiver([&] {
        const Fd fd(accept4(lfd.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!fd) return;
        std::vector<char> buf(1 << 16);
        uint64_t total = 0;
        for (ssize_t n; (n = recv(fd.get(), buf.data(), buf.size(), 0)) > 0;) {
            total += uint64_t(n);
            while (arrived.size() < chunks && total >= (arrived.size() + 1) * kChunk)
                arrived.push_back(Clock::now());
        }
    });
    Fd fd = mptcp_socket(lab.client_ns());
    const auto to = server_sockaddr(port);
    const bool connected =
        connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0;
    std::this_thread::sleep_for(300ms);  // the second subflow joins (ADD_ADDR, MP_JOIN)
    const std::vector<char> chunk(kChunk, 'e');
    const auto t0 = Clock::now();
    for (size_t i = 0; connected && i < chunks; i++) {
        std::this_thread::sleep_until(t0 + i * kChunkPeriod);
        for (size_t off = 0; off < kChunk;) {
            const ssize_t n = send(fd.get(), chunk.data() + off, kChunk - off, MSG_NOSIGNAL);
            if (n <= 0) break;
            off += size_t(n);
        }
    }
    // Closed before the join: the receiver reads to EOF.
    fd.reset();
    if (!connected) shutdown(lfd.get(), SHUT_RDWR);  // wakes the receiver's accept
    receiver.join();
    if (!connected || arrived.size() != chunks)
        throw Error("ecf: the stream delivered " + std::to_string(arrived.size()) + " of " +
                    std::to_string(chunks) + " chunks");
    std::vector<double> ms;
    for (size_t i = 0; i < chunks; i++)
        ms.push_back(std::chrono::duration<double, std::milli>(arrived[i] - (t0 + i * kChunkPeriod))
                         .count());
    return ms;
}

// Every regime once in one mode (the agent, when there, runs across all of them).
void ecf_run(Lab& lab, bool with_mpsteer, const Options& opt, const std::string& tag, int round,
             const std::string& rmem_default, uint16_t& port, Samples& out) {
    std::optional<PolicyAgent> agent;
    if (with_mpsteer)
        agent.emplace(opt, lab.client_ns(), "uc-" + tag + "-ecf",
                      std::vector<std::pair<std::string, AdaptedShare::Replacements>>{
                          {"policies/ecf-scheduler.yaml", {{"wwan0", lab.client_if(2)}}},
                          {"lua/ecf.lua", {}}});
    const char* mode = with_mpsteer ? "mpsteer" : "kernel";
    for (const auto& rg : kRegimes) {
        check_stop();
        lab.shape(2, rg.symmetric ? kWifi : kLte);
        set_rmem(lab, rg.small_rmem ? kRmemSmall : rmem_default);
        if (rg.kind == Kind::transfers) {
            for (uint64_t size : kSizes) {
                // Round 1's 8 MB WiFi+LTE transfer is the one plotted.
                const bool plot = round == 0 && size == kSizes.back() && !rg.small_rmem;
                const double s = transfer(lab, port++, size, plot ? out.path_rate : nullptr);
                out.completion_s[rg.key][size].push_back(s);
                spdlog::info("ecf round {} {} {}: {} MB in {:.3f} s", round + 1, mode, rg.key,
                             size / 1'000'000, s);
            }
        } else if (rg.kind == Kind::stream) {
            auto ms = paced_stream(lab, port++);
            spdlog::info("ecf round {} {} {}: chunk latency p50 {:.1f} ms p95 {:.1f} ms", round + 1,
                         mode, rg.key, quantile(ms, 0.5), quantile(ms, 0.95));
            auto& all = out.chunk_latency_ms[rg.key];
            all.insert(all.end(), ms.begin(), ms.end());
        } else {
            Sink sink(lab.server_ns(), port);
            send_stream(lab.client_ns(), Lab::server_addr(1), port++,
                        SendOptions::of_time(kBulkTime));
            const auto got = sink.wait(30s);
            const double mbit = double(got.bytes) * 8 / got.seconds / 1e6;
            out.bulk_mbit[rg.key].push_back(mbit);
            spdlog::info("ecf round {} {} {}: {:.1f} Mbit/s", round + 1, mode, rg.key, mbit);
        }
    }
    lab.shape(2, kLte);
    set_rmem(lab, rmem_default);
    if (agent)
        for (const auto& h : agent->process().status().value("lua_hooks", nlohmann::json::array()))
            spdlog::info("ecf round {} mpsteer: hook {} {}, {} calls, {} failures, {} writes",
                         round + 1, h.value("policy", ""), h.value("state", ""),
                         h.value("calls", 0), h.value("failures", 0), h.value("writes", 0));
}

std::string fixed(double v, const char* unit) {
    char b[64];
    std::snprintf(b, sizeof b, "%.3g %s", v, unit);
    return b;
}

}  // namespace

Report ecf_scheduling(const Options& opt) {
    Report r;
    r.name = "ecf";
    r.title = "ECF scheduling";
    r.setup =
        "client uploads to the server over two paths, path 1 RTT 20 ms 50 Mbit/s (WiFi-like), "
        "path 2 RTT 80 ms 10 Mbit/s (LTE-like; 20 ms 50 Mbit/s in the symmetric regime); "
        "transfers of 1, 2, 4, 8 MB on new connections (completion time, connect to "
        "last byte read), a 13 Mbit/s stream of 16 KiB chunks (write to last byte "
        "read), 5 s bulk; rmem: the receiver's tcp_rmem max 256 KiB; mpsteer: "
        "ecf-scheduler.yaml with lua/ecf.lua on the client";
    const std::string tag = "e" + std::to_string(getpid() % 100000);
    LabConfig cfg;
    cfg.tag = tag;
    cfg.path[0] = kWifi;
    cfg.path[1] = kLte;
    cfg.ipv6 = false;
    Lab lab(cfg);
    std::string rmem_default = must_in(lab.server_ns(), {"sysctl", "-n", "net.ipv4.tcp_rmem"});
    while (!rmem_default.empty() && std::isspace(uint8_t(rmem_default.back())))
        rmem_default.pop_back();
    Samples s[2];  // kernel, mpsteer
    uint16_t port = 7100;
    for (int round = 0; round < opt.rounds; round++)
        for (int m : {round % 2, 1 - round % 2})
            ecf_run(lab, m == 1, opt, tag, round, rmem_default, port, s[m]);

    r.columns = {"kernel", "mpsteer", "change"};
    double best = -1e9;
    // Lower is better for times, higher for rates; the change is the gain either way.
    auto compare = [&](const std::string& key, const std::string& label, double k, double m,
                       bool lower_better, const char* unit, bool realistic) {
        const double gain = lower_better ? k / m - 1 : m / k - 1;
        if (realistic) best = std::max(best, gain);
        char g[32];
        std::snprintf(g, sizeof g, "%+.1f %%", gain * 100);
        r.figures.push_back(
            Figure{key,
                   label,
                   ">= -3 %",
                   {Cell{k, fixed(k, unit), std::nullopt}, Cell{m, fixed(m, unit), std::nullopt},
                    Cell{gain, g, gain >= -0.03}}});
    };
    for (const auto& rg : kRegimes) {
        const std::string key = rg.key;
        if (rg.kind == Kind::transfers) {
            for (uint64_t size : kSizes) {
                const auto mb = std::to_string(size / 1'000'000);
                compare(key + "_" + mb + "mb_p50_s", std::string(rg.label) + ": " + mb + " MB p50",
                        quantile(s[0].completion_s[key][size], 0.5),
                        quantile(s[1].completion_s[key][size], 0.5), true, "s", rg.realistic);
            }
        } else if (rg.kind == Kind::stream) {
            for (double q : {0.5, 0.95})
                compare(key + "_p" + std::to_string(int(q * 100)) + "_ms",
                        std::string(rg.label) + ": chunk p" + std::to_string(int(q * 100)),
                        quantile(s[0].chunk_latency_ms[key], q),
                        quantile(s[1].chunk_latency_ms[key], q), true, "ms", rg.realistic);
        } else {
            compare(key + "_mbit", std::string(rg.label) + ": Mbit/s p50",
                    quantile(s[0].bulk_mbit[key], 0.5), quantile(s[1].bulk_mbit[key], 0.5), false,
                    "Mbit/s", rg.realistic);
        }
    }
    char b[32];
    std::snprintf(b, sizeof b, "%+.1f %%", best * 100);
    r.figures.push_back(Figure{"best_gain",
                               "best gain in a realistic regime",
                               ">= +15 %",
                               {Cell{}, Cell{}, Cell{best, b, best >= 0.15}}});

    for (int m = 0; m < 2; m++) {
        Plot p;
        p.file = "ecf-subflows-" + r.columns[m];
        p.title = "8 MB upload, WiFi+LTE, " + r.columns[m] + ": goodput per path";
        p.xlabel = "time since connect (s)";
        p.ylabel = "Mbit/s (acknowledged, per 100 ms)";
        for (int path = 0; path < 2; path++) {
            auto series = s[m].path_rate[path];
            series.label = path == 0 ? "path 1 (20 ms, 50 Mbit/s)" : "path 2 (80 ms, 10 Mbit/s)";
            p.series.push_back(std::move(series));
        }
        r.plots.push_back(std::move(p));
    }
    for (const auto& rg : kRegimes) {
        if (rg.kind != Kind::transfers) continue;
        Plot p;
        p.file = std::string("ecf-completion-") + rg.key;
        p.title = std::string(rg.label) + ": completion time";
        p.xlabel = "seconds";
        p.ylabel = "fraction of transfers";
        p.kind = "cdf";
        for (uint64_t size : {kSizes.front(), kSizes.back()})
            for (int m = 0; m < 2; m++)
                p.series.push_back(
                    Plot::Series{std::to_string(size / 1'000'000) + " MB " + r.columns[m],
                                 {},
                                 s[m].completion_s[rg.key][size]});
        r.plots.push_back(std::move(p));
    }
    return r;
}

}  // namespace mpsteer::cli::usecases
