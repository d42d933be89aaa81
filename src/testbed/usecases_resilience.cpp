// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Use case "paths that fail and come back": a client with two paths and a `subflow` endpoint on
// each downloads from the server's first address; 4 s in, path 1 fails for 10 s, either set
// down on the client (the link goes away) or silently blackholed in the network (its links stay
// up), then it comes back. The kernel alone, and with the agent running the shipped
// path-resilience policy on the client, in alternating runs. Measured from what the application
// reads, the interfaces' counters and the kernel's MPTCP events: the longest stall after the
// failure, the goodput while the path is out, when path 1 carries data again after its return
// (the old subflow resuming, or a new one), and whether a new subflow over it is established;
// and beside the download, an interactive stream (a small echo every 50 ms): its longest gap.
#include <linux/mptcp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <optional>
#include <spdlog/spdlog.h>
#include <string>
#include <thread>
#include <vector>

#include "lab/lab.h"
#include "net/stats.h"
#include "testbed/agent_process.h"
#include "testbed/usecases.h"

namespace mpsteer::cli::usecases {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;
using Clock = std::chrono::steady_clock;

const PathShape kPath{10, 20000};  // each path: RTT 20 ms, 20 Mbit/s
constexpr auto kFailAt = 4s;       // from the start of the download
constexpr auto kFailFor = 10s;
constexpr auto kAfter = 8s;  // the download goes on this long after the path's return
constexpr auto kSampleEvery = 100ms;
constexpr auto kInteractiveEvery = 50ms;  // the interactive stream: a message and its echo
constexpr double kInUseMbit = 1;          // a path carries data: at least this in a sample
// The targets with the policy: the stall's 95th percentile, and path 1 back in every run.
constexpr double kStallTargetS = 1.0, kBackTargetS = 3.0;

enum class Failure { down, blackhole };
const char* name_of(Failure f) {
    return f == Failure::down ? "down" : "blackhole";
}

struct Run {
    double stall_s = 0;              // longest gap between reads after the failure began
    double interactive_stall_s = 0;  // the same for the interactive stream's replies
    double failed_mbit = 0;          // goodput while the path was out
    double used_after_s = -1;        // path 1 carries data again, after its return; < 0: not seen
    double new_after_s = -1;         // a new subflow over path 1 established, after the return
    bool intact = false;
    std::vector<double> t, mbit[2];  // what each path delivered to the client, over time
};

double seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

void fail_path(Lab& lab, Failure f, bool failed) {
    if (f == Failure::blackhole) return lab.blackhole(1, failed);
    must({"ip", "-n", lab.client_ns(), "link", "set", lab.client_if(1), failed ? "down" : "up"});
}

Run download(Lab& lab, Failure failure, int family, uint16_t port) {
    const std::string cli = lab.client_ns();
    const std::string path1 = family == 6 ? Lab::client_addr6(1) : Lab::client_addr(1);
    MptcpMonitor monitor(cli);  // subscribed before the connection exists
    Source source(lab.server_ns(), port, SendOptions::of_time(kFailAt + kFailFor + kAfter),
                  family == 6);
    struct Read {
        Clock::time_point at;
        uint64_t bytes;
    };
    std::vector<Read> reads;
    reads.reserve(1 << 16);
    std::atomic<bool> done{false};
    TrafficStats rx;
    std::string error;
    auto rx_bytes = [&](int path) { return link_counters(cli, lab.client_if(path)).rx_bytes; };
    std::array<uint64_t, 2> last{rx_bytes(1), rx_bytes(2)};
    // Beside the download, over the same paths: an interactive stream on a connection of its own.
    const uint16_t echo_port = uint16_t(port + 500);
    Echo echo(lab.server_ns(), echo_port, family == 6);
    std::vector<Exchange> replies;
    bool echo_fallback = false;
    std::string echo_error;
    std::thread interactive([&] {
        try {
            replies = interactive_stream(
                cli, family == 6 ? Lab::server_addr6(1) : Lab::server_addr(1), echo_port,
                std::chrono::duration_cast<std::chrono::milliseconds>(kFailAt + kFailFor + kAfter),
                kInteractiveEvery, &echo_fallback);
        } catch (const std::exception& e) {
            echo_error = e.what();
        }
    });
    const auto t0 = Clock::now();
    std::thread reader([&] {
        try {
            rx = receive_stream(cli, family == 6 ? Lab::server_addr6(1) : Lab::server_addr(1), port,
                                kFailAt + kFailFor + kAfter + 120s, [&](uint64_t n) {
                                    reads.push_back({Clock::now(), n});
                                });
        } catch (const std::exception& e) {
            error = e.what();
        }
        done = true;
    });
    Run r;
    const auto fail_at = t0 + kFailAt, back_at = fail_at + kFailFor;
    bool failed = false, restored = false;
    try {
        for (auto next = t0 + kSampleEvery; !done; next += kSampleEvery) {
            std::this_thread::sleep_until(next);
            const auto now = Clock::now();
            if (!failed && now >= fail_at) {
                fail_path(lab, failure, true);
                failed = true;
            }
            if (failed && !restored && now >= back_at) {
                fail_path(lab, failure, false);
                restored = true;
            }
            for (const auto& e : monitor.poll(0ms))
                if (restored && r.new_after_s < 0 && e.type == MPTCP_EVENT_SUB_ESTABLISHED &&
                    e.saddr == path1)
                    r.new_after_s = seconds(Clock::now() - back_at);
            r.t.push_back(seconds(now - t0));
            for (int p = 0; p < 2; p++) {
                const uint64_t b = rx_bytes(p + 1);
                r.mbit[p].push_back((b - last[p]) * 8e-6 / seconds(kSampleEvery));
                last[p] = b;
            }
            if (restored && r.used_after_s < 0 && r.mbit[0].back() >= kInUseMbit)
                r.used_after_s = seconds(now - back_at);
        }
    } catch (...) {
        if (failed && !restored) fail_path(lab, failure, false);
        reader.join();
        interactive.join();
        throw;
    }
    reader.join();
    interactive.join();
    if (failed && !restored) fail_path(lab, failure, false);
    if (!error.empty())
        throw Error("resilience: download on port " + std::to_string(port) + ": " + error);
    if (!echo_error.empty())
        throw Error("resilience: interactive stream on port " + std::to_string(echo_port) + ": " +
                    echo_error);
    const TrafficStats tx = source.wait(30s);
    r.intact = arrived_intact(tx, rx) && !echo_fallback;
    // The stall: the longest time without a read that ends after the failure began (also
    // after the return: a subflow that comes back late can hold the stream up then).
    Clock::time_point prev = fail_at;
    uint64_t at_fail = 0, at_back = 0;
    for (const auto& rd : reads) {
        if (rd.at <= fail_at) {
            at_fail = rd.bytes;
            continue;
        }
        if (rd.at <= back_at) at_back = rd.bytes;
        r.stall_s = std::max(r.stall_s, seconds(rd.at - prev));
        prev = rd.at;
    }
    if (at_back < at_fail) at_back = at_fail;
    Clock::time_point prev_reply = fail_at;
    for (const auto& ex : replies) {
        const auto at = ex.replied;
        if (at <= fail_at) continue;
        r.interactive_stall_s = std::max(r.interactive_stall_s, seconds(at - prev_reply));
        prev_reply = at;
    }
    r.failed_mbit = (at_back - at_fail) * 8e-6 / seconds(kFailFor);
    return r;
}

}  // namespace

Report path_resilience(const Options& opt) {
    Report r;
    r.name = "resilience";
    r.title = "paths that fail and come back";
    r.setup = "client with two paths (RTT " + std::to_string(2 * kPath.delay_ms) + " ms, " +
              std::to_string(kPath.rate_kbit / 1000) +
              " Mbit/s each) and a subflow endpoint on each of its addresses, downloading from "
              "the server's path-1 address; " +
              std::to_string(std::chrono::seconds(kFailAt).count()) + " s in, path 1 fails for " +
              std::to_string(std::chrono::seconds(kFailFor).count()) +
              " s: set down on the client, or blackholed in the network (links up); then it "
              "comes back; the kernel alone and with policies/path-resilience.yaml on the "
              "client, alternating; stall = the longest time without data for the application "
              "that ends after the failure began; beside each download an interactive stream "
              "(a 256-byte echo every 50 ms) on a connection of its own";
    LabConfig cfg;
    const std::string tag = "rs" + std::to_string(getpid() % 100000);
    cfg.tag = tag;
    cfg.signal = false;
    cfg.path[0] = cfg.path[1] = kPath;
    Lab lab(cfg);
    const std::string cli = lab.client_ns();
    // IPv6 addresses survive the link going down (as IPv4 ones do), so path 1 can come back.
    must_in(cli, {"sysctl", "-qw", "net.ipv6.conf." + lab.client_if(1) + ".keep_addr_on_down=1"});
    // A `subflow` endpoint on every path, the one connections start on included: the path
    // manager then opens no second subflow over path 1, and the policy has an endpoint to
    // renew there. Room for the renewed subflows beside the old ones the server still holds.
    for (int path : {1, 2})
        for (const std::string& a : {Lab::client_addr(path), Lab::client_addr6(path)})
            must({"ip", "-n", cli, "mptcp", "endpoint", "add", a, "dev", lab.client_if(path),
                  "subflow"});
    for (const std::string& ns : {cli, lab.server_ns()})
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "4", "add_addr_accepted", "2"});
    // The path-2 subflow goes to the server's path-1 address over path 2. IPv4 finds it there
    // by ARP (a host answers for any of its addresses); IPv6 needs the client to route its
    // path-2 address's traffic there and to know the server's path-2 interface for that address
    // (IPv6 hosts answer neighbour solicitations only for the interface's own addresses).
    must({"ip", "-n", cli, "-6", "rule", "add", "from", Lab::client_addr6(2), "table", "102"});
    must({"ip", "-n", cli, "-6", "route", "add", "fd00:1::/64", "dev", lab.client_if(2), "table",
          "102"});
    const std::string s2_mac =
        must_in(lab.server_ns(), {"cat", "/sys/class/net/" + lab.server_if(2) + "/address"});
    must({"ip", "-n", cli, "-6", "neigh", "replace", Lab::server_addr6(1), "lladdr",
          s2_mac.substr(0, s2_mac.find_first_of(" \n")), "dev", lab.client_if(2), "nud",
          "permanent"});

    struct Column {
        int family;
        Failure failure;
        bool policy;
    };
    std::vector<Column> columns;
    for (Failure f : {Failure::down, Failure::blackhole})
        for (int family : {4, 6})
            for (bool policy : {false, true}) columns.push_back({family, f, policy});
    std::vector<std::vector<Run>> runs(columns.size());
    uint16_t port = 7400;  // one per download: no connection meets a TIME_WAIT of the last one
    for (int round = 0; round < opt.rounds; round++)
        for (bool policy : {round % 2 == 1, round % 2 == 0}) {  // which mode goes first alternates
            std::optional<PolicyAgent> agent;
            if (policy)
                agent.emplace(
                    opt, cli, "uc-" + tag,
                    std::vector<std::pair<std::string, AdaptedShare::Replacements>>{
                        {"policies/path-resilience.yaml", {}}, {"lua/path_resilience.lua", {}}});
            for (size_t c = 0; c < columns.size(); c++) {
                if (columns[c].policy != policy) continue;
                check_stop();
                Run run = download(lab, columns[c].failure, columns[c].family, port++);
                auto after = [](double s) {
                    return s < 0 ? std::string("no") : fixed(s, 2) + " s";
                };
                spdlog::info(
                    "resilience round {} IPv{} {}{}: stall {:.2f} s (interactive {:.2f} s), "
                    "{:.1f} Mbit/s while out, path 1 used again {}, a new subflow on it {}",
                    round + 1, columns[c].family, name_of(columns[c].failure),
                    policy ? " with the policy" : "", run.stall_s, run.interactive_stall_s,
                    run.failed_mbit, after(run.used_after_s), after(run.new_after_s));
                runs[c].push_back(std::move(run));
            }
            if (agent) agent->process().stop();
        }

    for (const auto& c : columns)
        r.columns.push_back("IPv" + std::to_string(c.family) + " " + name_of(c.failure) +
                            (c.policy ? " +policy" : ""));
    Figure stall{"stall_s",
                 "longest stall after the failure, median (p95, max), s",
                 "p95 <= " + fixed(kStallTargetS, 1) + " s with the policy",
                 {}};
    Figure istall{"interactive_stall_s",
                  "interactive stream (a 256-byte echo every 50 ms): longest gap between replies "
                  "after the failure, median (p95, max), s",
                  "p95 <= " + fixed(kStallTargetS, 1) + " s with the policy",
                  {}};
    Figure goodput{"failed_mbit", "goodput while path 1 is out, median, Mbit/s", "", {}};
    Figure used{"path1_used",
                "path 1 carries data again after its return (runs, median, max s)",
                "every run, within " + fixed(kBackTargetS, 0) + " s, with the policy",
                {}};
    Figure fresh{"path1_new_subflow", "a new subflow over path 1 after its return", "", {}};
    Figure damaged{"damaged", "downloads damaged or fallen back to TCP", "0", {}};
    for (size_t c = 0; c < columns.size(); c++) {
        const auto& rs = runs[c];
        std::vector<double> s, g, u, is;
        unsigned bad = 0, renewed = 0;
        for (const auto& x : rs) {
            s.push_back(x.stall_s);
            is.push_back(x.interactive_stall_s);
            g.push_back(x.failed_mbit);
            if (x.used_after_s >= 0) u.push_back(x.used_after_s);
            renewed += x.new_after_s >= 0;
            bad += !x.intact;
        }
        const double worst = s.empty() ? 0 : *std::max_element(s.begin(), s.end());
        const double p95 = net::quantile(s, 0.95);
        const double back_max = u.empty() ? 0 : *std::max_element(u.begin(), u.end());
        auto target = [&](bool met) {
            return columns[c].policy ? std::optional<bool>(met) : std::nullopt;
        };
        stall.cells.push_back(
            {nlohmann::ordered_json{{"median", net::median(s)}, {"p95", p95}, {"max", worst}},
             fixed(net::median(s), 2) + " (" + fixed(p95, 2) + ", " + fixed(worst, 2) + ")",
             target(!s.empty() && p95 <= kStallTargetS)});
        const double ip95 = net::quantile(is, 0.95);
        const double iworst = is.empty() ? 0 : *std::max_element(is.begin(), is.end());
        istall.cells.push_back(
            {nlohmann::ordered_json{{"median", net::median(is)}, {"p95", ip95}, {"max", iworst}},
             fixed(net::median(is), 2) + " (" + fixed(ip95, 2) + ", " + fixed(iworst, 2) + ")",
             target(!is.empty() && ip95 <= kStallTargetS)});
        goodput.cells.push_back({net::median(g), fixed(net::median(g), 1), {}});
        used.cells.push_back(
            {nlohmann::ordered_json{{"runs", u.size()},
                                    {"of", rs.size()},
                                    {"median_s", net::median(u)},
                                    {"max_s", back_max}},
             std::to_string(u.size()) + "/" + std::to_string(rs.size()) +
                 (u.empty() ? ""
                            : ", " + fixed(net::median(u), 2) + ", " + fixed(back_max, 2) + " s"),
             target(!rs.empty() && u.size() == rs.size() && back_max <= kBackTargetS)});
        fresh.cells.push_back({nlohmann::ordered_json{{"runs", renewed}, {"of", rs.size()}},
                               std::to_string(renewed) + "/" + std::to_string(rs.size()),
                               {}});
        damaged.cells.push_back({bad, std::to_string(bad), target(bad == 0)});
    }
    r.figures = {stall, istall, goodput, used, fresh, damaged};
    for (size_t c = 0; c < columns.size(); c++) {
        if (columns[c].family != 4 || runs[c].empty()) continue;
        const Run& x = runs[c].front();
        const std::string mode = columns[c].policy ? "policy" : "kernel";
        Plot p{std::string("resilience-") + name_of(columns[c].failure) + "-" + mode,
               std::string("path 1 ") + name_of(columns[c].failure) + " from " +
                   std::to_string(std::chrono::seconds(kFailAt).count()) + " s to " +
                   std::to_string(std::chrono::seconds(kFailAt + kFailFor).count()) + " s, " +
                   (columns[c].policy ? "with the path-resilience policy" : "the kernel alone") +
                   " (round 1): throughput per path",
               "seconds",
               "Mbit/s",
               "lines",
               {{"path 1", x.t, x.mbit[0]}, {"path 2", x.t, x.mbit[1]}}};
        r.plots.push_back(std::move(p));
    }
    return r;
}

}  // namespace mpsteer::cli::usecases
