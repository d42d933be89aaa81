// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Use case "disjoint subflows for large flows" (eMPTCP, ICNP 2022, the second half of its
// path manager): a client with two access links (WiFi-like and LTE-like: the bottlenecks)
// downloads from a server with two addresses. With full-mesh endpoints the client's in-kernel
// path manager opens a subflow from each of its addresses to each of the server's, so two
// subflows share each access link; policies/disjoint-subflows.yaml on the client refuses the
// joins of the address pairs that double up on a link, leaving one subflow per link.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <spdlog/spdlog.h>
#include <string>
#include <thread>
#include <vector>

#include "testbed/agent_process.h"
#include "testbed/usecases.h"
#include "lab/lab.h"

namespace mpsteer::cli::usecases {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;
using Clock = std::chrono::steady_clock;

const PathShape kWifi{10, 50000};  // RTT 20 ms, 50 Mbit/s
const PathShape kLte{30, 10000};   // RTT 60 ms, 10 Mbit/s
constexpr auto kDownload = 5s;     // the server sends this long; the client reads to the end
constexpr auto kSampleEvery = 200ms;

// The client's receive buffer: the kernel's default, and two caps (tcp_rmem max) under which
// the connection's receive window, not the links, limits a download.
struct Regime {
    const char* key;
    const char* label;
    const char* rmem;  // tcp_rmem of the client; nullptr: the namespace's default
    bool judged;       // the +15 % target; the others must not lose more than 3 %
};
const Regime kRegimes[] = {
    {"default", "rmem default (max 6 MiB)", nullptr, false},
    {"rmem_2m", "rmem max 2 MiB", "4096 131072 2097152", false},
    {"rmem_1m", "rmem max 1 MiB", "4096 131072 1048576", true},
};
constexpr size_t kRegimeCount = sizeof kRegimes / sizeof kRegimes[0];

struct Run {
    uint64_t bytes = 0;
    double seconds = 0;
    bool intact = false;
    unsigned established = 0;            // the connection's subflows half-way through
    std::array<uint64_t, 2> link{0, 0};  // bytes the client received per access link
    std::vector<double> t, mbit[2];      // per access link over time
};

// One download from the server's first address; with `trace`, what each access link
// delivered every kSampleEvery.
Run download(const Lab& lab, uint16_t port, bool trace) {
    Source source(lab.server_ns(), port, SendOptions::of_time(kDownload));
    std::atomic<bool> done{false};
    TrafficStats rx;
    std::string error;
    auto rx_bytes = [&lab](int path) {
        return link_counters(lab.client_ns(), lab.client_if(path)).rx_bytes;
    };
    const std::array<uint64_t, 2> rx0{rx_bytes(1), rx_bytes(2)};
    std::thread reader([&] {
        try {
            rx = receive_stream(lab.client_ns(), Lab::server_addr(1), port, kDownload + 30s);
        } catch (const std::exception& e) {
            error = e.what();
        }
        done = true;
    });
    Run r;
    // The subflows as the kernel has them half-way through (established sockets to the port).
    std::thread census([&] {
        std::this_thread::sleep_for(kDownload / 2);
        const std::string suffix = ":" + std::to_string(port);
        for (const auto& sf : tcp_subflows(lab.client_ns()))
            if (sf.remote.size() > suffix.size() &&
                sf.remote.compare(sf.remote.size() - suffix.size(), suffix.size(), suffix) == 0)
                r.established++;
    });
    const auto t0 = Clock::now();
    std::array<uint64_t, 2> last = rx0;
    for (auto next = t0 + kSampleEvery; !done; next += kSampleEvery) {
        std::this_thread::sleep_until(next);
        if (!trace) continue;
        r.t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        for (int p = 0; p < 2; p++) {
            const uint64_t now = rx_bytes(p + 1);
            r.mbit[p].push_back((now - last[p]) * 8e-6 /
                                std::chrono::duration<double>(kSampleEvery).count());
            last[p] = now;
        }
    }
    reader.join();
    census.join();
    if (!error.empty())
        throw Error("disjoint: download on port " + std::to_string(port) + ": " + error);
    const TrafficStats tx = source.wait(10s);
    for (int p = 0; p < 2; p++) r.link[p] = rx_bytes(p + 1) - rx0[p];
    r.bytes = rx.bytes;
    r.seconds = rx.seconds;
    r.intact = arrived_intact(tx, rx);
    return r;
}

}  // namespace

Report disjoint_subflows(const Options& opt) {
    Report r;
    r.name = "disjoint";
    r.title = "disjoint subflows for large flows";
    r.setup = "client with a WiFi-like link (RTT " + std::to_string(2 * kWifi.delay_ms) + " ms, " +
              std::to_string(kWifi.rate_kbit / 1000) + " Mbit/s) and an LTE-like link (RTT " +
              std::to_string(2 * kLte.delay_ms) + " ms, " + std::to_string(kLte.rate_kbit / 1000) +
              " Mbit/s), fullmesh endpoints on both addresses; the server announces its second "
              "address, so the kernel opens a subflow from each client address to each server "
              "address, two per link; per round and mode one " +
              std::to_string(std::chrono::seconds(kDownload).count()) +
              " s download per receive-buffer regime; mpsteer: disjoint-subflows.yaml on the "
              "client refuses the joins that double up on a link; reference: the kernel without "
              "fullmesh endpoints";
    LabConfig cfg;
    const std::string tag = "dj" + std::to_string(getpid() % 100000);
    cfg.tag = tag;
    cfg.ipv6 = false;
    cfg.path[0] = kWifi;
    cfg.path[1] = kLte;
    Lab lab(cfg);
    const std::string cli = lab.client_ns();
    // Four subflows: the server accepts three joins, the client opens them from both addresses
    // (each endpoint binds its subflows to its interface: a subflow leaves by its address's link).
    for (const auto& ns : {cli, lab.server_ns()})
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "4", "add_addr_accepted", "2"});
    std::string rmem_default = must_in(cli, {"sysctl", "-n", "net.ipv4.tcp_rmem"});
    rmem_default.erase(rmem_default.find_last_not_of(" \n") + 1);

    // Modes: the kernel with the full mesh, the same with mpsteer, and (a reference) the
    // kernel's path manager without fullmesh endpoints, which joins the announced address only
    // from the address the route picks (the LTE one): disjoint without a policy.
    constexpr int kModes = 3;
    std::vector<Run> runs[kModes][kRegimeCount];  // [mode][regime]
    uint16_t port = 7000;  // one per download: no connection meets a TIME_WAIT of the last one
    for (int round = 0; round < opt.rounds; round++)
        for (int k = 0; k < kModes; k++) {
            const int m = (round + k) % kModes;  // the order rotates round by round
            must({"ip", "-n", cli, "mptcp", "endpoint", "flush"});
            if (m != 2) {
                must({"ip", "-n", cli, "mptcp", "endpoint", "add", Lab::client_addr(1), "dev",
                      lab.client_if(1), "fullmesh"});
                must({"ip", "-n", cli, "mptcp", "endpoint", "add", Lab::client_addr(2), "dev",
                      lab.client_if(2), "subflow", "fullmesh"});
            }
            std::optional<PolicyAgent> agent;
            if (m == 1)
                agent.emplace(opt, cli, "uc-" + tag,
                              std::vector<std::pair<std::string, AdaptedShare::Replacements>>{
                                  {"policies/disjoint-subflows.yaml", {}}});
            for (size_t g = 0; g < kRegimeCount; g++) {
                check_stop();
                const Regime& rg = kRegimes[g];
                must_in(cli, {"sysctl", "-qw",
                              "net.ipv4.tcp_rmem=" + (rg.rmem ? rg.rmem : rmem_default)});
                Run run = download(lab, port++, round == 0);
                spdlog::info(
                    "disjoint round {} {} {}: {:.1f} Mbit/s, {} subflows, {} B by WiFi, "
                    "{} B by LTE",
                    round + 1,
                    m == 1 ? "mpsteer"
                    : m    ? "no-fullmesh"
                           : "kernel",
                    rg.key, run.seconds ? run.bytes * 8e-6 / run.seconds : 0.0, run.established,
                    run.link[0], run.link[1]);
                runs[m][g].push_back(std::move(run));
            }
            must_in(cli, {"sysctl", "-qw", "net.ipv4.tcp_rmem=" + rmem_default});
        }

    r.columns = {"kernel", "mpsteer", "kernel, no fullmesh"};
    for (size_t g = 0; g < kRegimeCount; g++) {
        const Regime& rg = kRegimes[g];
        Figure f{std::string("mbit_") + rg.key,
                 std::string("download, ") + rg.label + " (Mbit/s)",
                 rg.judged ? "+15 %" : ">= -3 %",
                 {}};
        double v[kModes];
        for (int m = 0; m < kModes; m++) {
            uint64_t bytes = 0;
            double seconds = 0;
            std::vector<double> per_run;
            for (const auto& x : runs[m][g]) {
                bytes += x.bytes;
                seconds += x.seconds;
                per_run.push_back(x.seconds ? x.bytes * 8e-6 / x.seconds : 0);
            }
            v[m] = seconds ? bytes * 8e-6 / seconds : 0;
            auto [lo, hi] = std::minmax_element(per_run.begin(), per_run.end());
            f.cells.push_back(
                {v[m], fixed(v[m], 1) + " (" + fixed(*lo, 1) + "-" + fixed(*hi, 1) + ")", {}});
        }
        for (int m = 1; m < kModes; m++) {
            const double gain = v[0] ? v[m] / v[0] - 1 : 0;
            f.cells[m].value = {{"mbit_per_s", v[m]}, {"gain", gain}};
            f.cells[m].text +=
                " " + std::string(gain >= 0 ? "+" : "") + fixed(100 * gain, 1) + " %";
        }
        const double gain = v[0] ? v[1] / v[0] - 1 : 0;
        f.cells[1].met = v[0] > 0 && (rg.judged ? gain >= 0.15 : gain >= -0.03);
        r.figures.push_back(std::move(f));
    }
    for (size_t g = 0; g < kRegimeCount; g++) {
        const Regime& rg = kRegimes[g];
        Figure f{std::string("lte_share_") + rg.key,
                 std::string("share of the bytes by LTE, ") + rg.label,
                 "",
                 {}};
        for (int m = 0; m < kModes; m++) {
            uint64_t lte = 0, all = 0;
            for (const auto& x : runs[m][g]) lte += x.link[1], all += x.link[0] + x.link[1];
            const double share = all ? double(lte) / double(all) : 0;
            f.cells.push_back({share, fixed(100 * share, 1) + " %", {}});
        }
        r.figures.push_back(std::move(f));
    }
    {
        Figure f{"subflows", "subflows half-way (per download, min-max)", "", {}};
        for (int m = 0; m < kModes; m++) {
            unsigned lo = ~0u, hi = 0;
            for (const auto& per : runs[m])
                for (const auto& x : per)
                    lo = std::min(lo, x.established), hi = std::max(hi, x.established);
            f.cells.push_back(
                {nlohmann::ordered_json{{"min", lo}, {"max", hi}},
                 lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi),
                 {}});
        }
        f.cells[1].met = std::nullopt;
        r.figures.push_back(std::move(f));
    }
    {
        Figure f{"damaged", "downloads damaged or fallen back to TCP", "0", {}};
        for (int m = 0; m < kModes; m++) {
            unsigned n = 0;
            for (const auto& per : runs[m])
                for (const auto& x : per) n += !x.intact;
            f.cells.push_back({n, std::to_string(n), {}});
        }
        f.cells[1].met = f.cells[1].value == 0;
        r.figures.push_back(std::move(f));
    }
    // Round 1 of the judged regime: what each link delivered.
    for (size_t g = 0; g < kRegimeCount; g++) {
        if (!kRegimes[g].judged) continue;
        Plot p{std::string("disjoint-links-") + kRegimes[g].key,
               std::string("download, ") + kRegimes[g].label + " (round 1): throughput per link",
               "seconds",
               "Mbit/s",
               "lines",
               {}};
        for (int m = 0; m < 2; m++)
            for (int l = 0; l < 2; l++)
                p.series.push_back({r.columns[m] + ": " + (l ? "LTE" : "WiFi") + " link",
                                    runs[m][g].front().t, runs[m][g].front().mbit[l]});
        r.plots.push_back(std::move(p));
    }
    return r;
}

}  // namespace mpsteer::cli::usecases
