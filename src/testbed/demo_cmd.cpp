// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer demo: mpsteer on live MPTCP traffic, end to end, in a throw-away lab of two
// namespaces joined by two paths.
//  - default: the agent (`mpsteer run`) in the client's namespace applies the shipped policies;
//    a small download stays on one subflow (the server's ADD_ADDR is hidden), a large one gets
//    its second subflow once past the small-flow threshold; then `mpsteer status`.
//  - --chain: a chain loaded directly on the server (record, get_connect, get_subflow, and
//    rate_limit on path 2) while the client uploads; connections, subflows and per-path rates.
// Everything it creates (namespaces, links, pins, the agent's state) is removed at the end.
#include <arpa/inet.h>
#include <linux/mptcp.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <spdlog/spdlog.h>
#include <thread>

#include "agent/agent.h"
#include "testbed/agent_process.h"
#include "cli/commands.h"
#include "testbed/usecases.h"
#include "datapath/datapath.h"
#include "lab/lab.h"
#include "net/address.h"

namespace mpsteer::cli {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;
using datapath::Event;

constexpr uint64_t kLimit = 1'000'000;  // bytes/s on path 2: 8 Mbit/s
constexpr uint16_t kPort = 5201;

std::atomic<bool> g_stop{false};

std::string hex(uint32_t v) {
    char b[12];
    std::snprintf(b, sizeof b, "%08x", v);
    return b;
}

// "10.0.2.1:40991 -> 10.0.2.2:5201", client first (the lower address in the lab).
std::string subflow_name(const mps_flow_key& k) {
    return net::address_text(4, k.a) + ":" + std::to_string(k.port_a) + " -> " +
           net::address_text(4, k.b) + ":" + std::to_string(k.port_b);
}

int path_of(const mps_flow_key& k) {
    for (int p = 1; p <= 2; p++)
        if (net::address_text(4, k.b) == Lab::server_addr(p)) return p;
    return 0;
}

std::string mbit(double bytes_per_sec) {
    char b[32];
    std::snprintf(b, sizeof b, "%6.2f Mbit/s", bytes_per_sec * 8 / 1e6);
    return b;
}

// The demos' lab: RTT 20 ms and 40 Mbit/s on each path; `tag` names everything it creates.
LabConfig lab_config(const std::string& tag) {
    LabConfig cfg;
    cfg.tag = tag + std::to_string(getpid() % 1000000);
    cfg.path[0] = cfg.path[1] = PathShape{10, 40000};
    std::printf("mpsteer demo: building the lab (two namespaces, two paths)...\n");
    return cfg;
}

void print_lab(const Lab& lab) {
    std::printf("  client  %-16s %s (path 1), %s (path 2)\n", lab.client_ns().c_str(),
                Lab::client_addr(1).c_str(), Lab::client_addr(2).c_str());
    std::printf("  server  %-16s %s (path 1), %s (path 2, announced with ADD_ADDR)\n",
                lab.server_ns().c_str(), Lab::server_addr(1).c_str(), Lab::server_addr(2).c_str());
    std::printf("  paths   RTT 20 ms and 40 Mbit/s each; kernel MPTCP, 2 subflows allowed\n");
}

class Demo {
public:
    explicit Demo(int seconds) : seconds_(seconds) {}

    int run() {
        Lab lab(lab_config("d"));
        print_lab(lab);

        datapath::init_libbpf_logging();
        Steering steer(server_chains(lab, kLimit), lab.server_ns(), Steering::pin_root_for("demo"));
        std::printf("  chain   loaded on the server (%s):\n", steer.state().pin_root().c_str());
        std::istringstream chains(steer.generation().chains().describe());
        for (std::string line; std::getline(chains, line);)
            std::printf("            %s\n", line.c_str());
        for (const auto& l : steer.links())
            std::printf("          attached to %s %s (%s)\n", l->ifname().c_str(),
                        std::string(to_string(l->hook())).c_str(), l->mode().c_str());

        MptcpMonitor kernel(lab.server_ns());
        datapath::EventReader events(steer.state(), [&](const Event& e) { on_event(e); });
        Sink sink(lab.server_ns(), kPort);
        std::printf("\nuploading from client to %s:%u for %d s (Ctrl-C stops early)\n\n",
                    Lab::server_addr(1).c_str(), kPort, seconds_);
        t0_ = std::chrono::steady_clock::now();

        TrafficStats sent;
        std::string send_error;
        std::atomic<bool> done{false};
        std::thread sender([&] {
            try {
                sent = send_stream(lab.client_ns(), Lab::server_addr(1), kPort,
                                   SendOptions::of_time(std::chrono::seconds(seconds_), &g_stop));
            } catch (const std::exception& e) {
                send_error = e.what();
            }
            done = true;
        });
        double next_tick = 1.0;
        while (!done) {
            events.poll(20ms);
            for (const auto& k : kernel.poll(0ms)) on_kernel(k);
            if (elapsed() >= next_tick) {
                tick(steer);
                next_tick += 1.0;
            }
        }
        sender.join();
        if (!send_error.empty()) throw Error(send_error);
        TrafficStats got = sink.wait(30s);
        events.poll(50ms);
        for (const auto& k : kernel.poll(100ms)) on_kernel(k);
        return summary(sent, got);
    }

private:
    double elapsed() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }
    void stamp() const { std::printf("[%6.2fs] ", elapsed()); }

    void on_event(const Event& e) {
        const auto& r = e.raw;
        const char* hook = r.hook == MPS_HOOK_XDP ? "xdp" : "tc egress";
        if (r.type == MPS_EV_MP_CAPABLE) {
            // The keys travel in the SYN/ACK, the third ACK and the first data packets: say
            // once that a connection started and once what its tokens are.
            mpc_++;
            const std::string name = subflow_name(r.flow);
            if (e.token_a && e.token_b) {
                if (!told_.insert(name + "/tokens").second) return;
                stamp();
                std::printf(
                    "connection  %s  MP_CAPABLE v%u keys -> tokens client %s, server "
                    "%s (%s)\n",
                    name.c_str(), r.version, hex(e.token_a).c_str(), hex(e.token_b).c_str(), hook);
                tok_client_ = e.token_a;
                tok_server_ = e.token_b;
            } else if (told_.insert(name).second) {
                stamp();
                std::printf("connection  %s  MP_CAPABLE v%u, %s key seen (%s)\n", name.c_str(),
                            r.version, r.from_a ? "client" : "server", hook);
            }
        } else if (r.type == MPS_EV_MP_JOIN) {
            joins_++;
            stamp();
            std::printf("subflow     %s  MP_JOIN to token %s (address id %u, backup %u) (%s)\n",
                        subflow_name(r.flow).c_str(), hex(r.token).c_str(), r.addr_id,
                        unsigned(datapath::decode(r).backup), hook);
        } else if (r.type == MPS_EV_FLOW_CLOSED) {
            stamp();
            std::printf("closed      %s\n", subflow_name(r.flow).c_str());
        }
    }

    // The kernel's own account (MPTCP netlink events in the server namespace).
    void on_kernel(const MptcpEvent& k) {
        stamp();
        std::printf("  kernel    %s\n", to_string(k).c_str());
    }

    // Per-subflow counters from the flow map (what `record` counted), once a second.
    void tick(const Steering& steer) {
        double now = elapsed();
        bool first = true;
        for (const auto& [k, f] : steer.flows()) {
            if (k.port_b != kPort) continue;
            int path = path_of(k);
            auto& last = last_[subflow_name(k)];
            double rate = (f.dir_ab.bytes - last.bytes) / (now - last.t);
            last = {f.dir_ab.bytes, now};
            if (first)
                stamp();
            else
                std::printf("          ");
            first = false;
            std::printf("path %d  %-30s %s  %8llu pkts in, %6llu out, srtt %5.1f ms%s\n", path,
                        subflow_name(k).c_str(), mbit(rate).c_str(),
                        static_cast<unsigned long long>(f.dir_ab.packets),
                        static_cast<unsigned long long>(f.dir_ba.packets), f.srtt_us / 1000.0,
                        path == 2 ? "  [rate_limit 8 Mbit/s]" : "");
        }
    }

    int summary(const TrafficStats& sent, const TrafficStats& got) {
        const bool intact = sent.bytes == got.bytes && sent.checksum == got.checksum;
        const bool tokens = tok_client_ == sent.token && tok_server_ == got.token;
        std::printf("\nsummary\n");
        std::printf("  transfer  %.1f MB in %.1f s, %s\n", sent.bytes / 1e6, sent.seconds,
                    intact ? "received intact (content checksum matches)" : "DAMAGED");
        std::printf(
            "  tokens    kernel: client %s, server %s; from the keys get_connect saw: "
            "client %s, server %s -> %s\n",
            hex(sent.token).c_str(), hex(got.token).c_str(), hex(tok_client_).c_str(),
            hex(tok_server_).c_str(), tokens ? "match" : "MISMATCH");
        std::printf(
            "  subflows  mpsteer saw %d MP_CAPABLE event(s) and %d MP_JOIN; the kernel "
            "had %u subflow(s) besides the first\n",
            mpc_, joins_, sent.subflows);
        std::printf("  cleanup   removing the namespaces, links and pins\n");
        return intact && tokens && joins_ >= 1 ? 0 : 1;
    }

    struct Last {
        uint64_t bytes = 0;
        double t = 0;
    };
    int seconds_;
    std::chrono::steady_clock::time_point t0_;
    std::map<std::string, Last> last_;
    std::set<std::string> told_;
    int mpc_ = 0, joins_ = 0;
    uint32_t tok_client_ = 0, tok_server_ = 0;
};

// ---- the agent demo --------------------------------------------------------------------------

// With `plot_dir`, download 2's throughput per subflow over time is drawn there as
// demo-subflows.png (sampled from the client's sockets every 100 ms).
int agent_demo(const std::string& share, int seconds, const std::string& plot_dir,
               std::chrono::seconds ready_timeout) {
    const LabConfig cfg = lab_config("a");
    Lab lab(cfg);
    print_lab(lab);
    std::printf("\n");

    std::vector<std::string> leave_out;
    for (const auto& e : shipped_elsewhere()) leave_out.push_back(e.file);
    ShippedAgent agent(share, lab.client_ns(), "demo-" + cfg.tag, leave_out);
    for (const auto& e : shipped_elsewhere())
        std::printf("not loaded here: policies/%s (for %s)\n", e.file.c_str(), e.host.c_str());
    std::printf("starting the agent on the client:\n  mpsteer");
    for (const auto& a : agent.args()) std::printf(" %s", a.c_str());
    std::printf("\n  (its log: %s)\n", agent.log().c_str());
    const auto t0 = std::chrono::steady_clock::now();
    const nlohmann::json st = agent.wait_ready(ready_timeout);
    // Right after the apply the agent loads the compiled entries (milliseconds on a server,
    // minutes under emulation), and links connections only after that: the downloads wait.
    std::this_thread::sleep_for(1s);
    agent.wait_status_update(ready_timeout);
    std::printf("  Ready after %.1f s: generation %d, revision %s, %zu policies, %zu hooks\n\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                st.value("generation", 0), st.value("applied_revision", "").c_str(),
                st["policies"].size(), st["attachments"].size());

    MptcpMonitor kernel(lab.client_ns());
    constexpr uint16_t port = 5301;
    // Bytes each path's subflow of the connection on port p has received, every 100 ms.
    struct Sample {
        double seconds;
        std::array<uint64_t, 2> path_bytes;
    };
    auto transfer = [&](const char* what, const SendOptions& opt, uint16_t p,
                        std::vector<Sample>* trace) {
        std::printf("%s\n", what);
        Source source(lab.server_ns(), p, opt);
        std::atomic<uint64_t> got{0};
        TrafficStats rx;
        std::string err;
        std::thread rx_thread([&] {
            try {
                rx = receive_stream(lab.client_ns(), Lab::server_addr(1), p, 120s,
                                    [&](uint64_t n) { got = n; });
            } catch (const std::exception& e) {
                err = e.what();
            }
        });
        const auto start = std::chrono::steady_clock::now();
        std::atomic<bool> finished{false};
        std::thread sampler;
        if (trace)  // `ss` takes milliseconds: a thread of its own keeps the events timely
            sampler = std::thread([&] {
                for (auto next = start; !finished; next += 100ms) {
                    std::this_thread::sleep_until(next);
                    trace->push_back(
                        {std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                             .count(),
                         lab.client_received_per_path(p)});
                }
            });
        unsigned joined = 0;
        for (bool done = false; !done;) {
            done = rx.seconds > 0 || !err.empty();
            for (const auto& k : kernel.poll(done ? 100ms : 20ms)) {
                if (k.type != MPTCP_EVENT_SUB_ESTABLISHED) continue;
                ++joined;
                std::printf(
                    "  [%5.2fs] kernel: subflow %s:%u -> %s:%u established after %.0f KB\n",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    k.saddr.c_str(), k.sport, k.daddr.c_str(), k.dport, got / 1e3);
            }
        }
        rx_thread.join();
        finished = true;
        if (sampler.joinable()) sampler.join();
        if (!err.empty()) throw Error(err);
        TrafficStats tx = source.wait(30s);
        const bool intact = tx.bytes == rx.bytes && tx.checksum == rx.checksum;
        std::printf("  %.1f KB in %.2f s, %s, MPTCP %s, %u extra subflow(s)\n\n", rx.bytes / 1e3,
                    rx.seconds, intact ? "intact (checksum matches)" : "DAMAGED",
                    rx.fallback ? "FELL BACK to TCP" : "kept", joined);
        return std::pair{intact && !rx.fallback, joined};
    };
    auto [small_ok, small_joins] =
        transfer("download 1: 100 KB from the server (below the 220 KB small-flow threshold)",
                 SendOptions::of_bytes(100'000), port, nullptr);
    std::vector<Sample> trace;
    auto [large_ok, large_joins] = transfer(
        ("download 2: " + std::to_string(seconds) + " s from the server (crosses the threshold)")
            .c_str(),
        SendOptions::of_time(std::chrono::seconds(seconds), &g_stop), port + 1,
        plot_dir.empty() ? nullptr : &trace);
    if (!plot_dir.empty()) {
        usecases::Plot plot{"demo-subflows",
                            "download 2 with the shipped policies: throughput per subflow",
                            "time since connect (s)",
                            "Mbit/s",
                            "lines",
                            {}};
        for (int path = 0; path < 2; path++) {
            usecases::Plot::Series s{path == 0 ? "path 1 (the first subflow)"
                                               : "path 2 (joined once past the 220 KB threshold)",
                                     {},
                                     {}};
            for (size_t i = 1; i < trace.size(); i++) {
                const double dt = trace[i].seconds - trace[i - 1].seconds;
                const uint64_t was = trace[i - 1].path_bytes[path], now = trace[i].path_bytes[path];
                s.x.push_back(trace[i].seconds);
                s.y.push_back(dt > 0 && now >= was ? double(now - was) * 8 / dt / 1e6 : 0);
            }
            plot.series.push_back(std::move(s));
        }
        std::printf("picture: %s\n\n", usecases::draw_plot(plot, plot_dir, share).c_str());
    }

    std::printf("mpsteer status --state-dir %s\n", agent.state_dir().c_str());
    std::fflush(stdout);
    std::system((agent_binary() + " status --state-dir " + agent.state_dir()).c_str());
    agent.stop();
    const bool ok = small_ok && large_ok && small_joins == 0 && large_joins >= 1;
    std::printf(
        "\nsummary   small download on one subflow: %s; large download got its second "
        "subflow: %s\n          cleanup: stopping the agent, removing %s, %s and the lab\n",
        small_joins == 0 ? "yes" : "NO", large_joins >= 1 ? "yes" : "NO", agent.pin_root().c_str(),
        agent.state_dir().c_str());
    return ok ? 0 : 1;
}

}  // namespace

void add_demo_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "demo",
        "Build a two-namespace MPTCP lab, run the agent with the shipped policies on it "
        "and show them acting on live traffic (needs root)");
    static int seconds = 5;
    static bool chain = false;
    static std::string share = default_share();
    static std::string plot_dir;
    static int ready_timeout = static_cast<int>(ShippedAgent::kFirstApplyTimeout.count());
    cmd->add_option("--plot", plot_dir,
                    "also draw the large download's throughput per subflow over time as "
                    "DIR/demo-subflows.png (needs python3-matplotlib)");
    cmd->add_option("--seconds", seconds, "how long the large download (or --chain's upload) runs")
        ->check(CLI::Range(1, 3600))
        ->capture_default_str();
    cmd->add_option("--share", share,
                    "where the shipped policies/ and lua/ are (the agent gets a copy)")
        ->check(CLI::ExistingDirectory)
        ->capture_default_str();
    // The first apply loads every program through the verifier: seconds on a server, tens of
    // minutes on an old kernel under emulation.
    cmd->add_option("--ready-timeout", ready_timeout,
                    "how long to wait for the agent's first apply, in seconds")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    cmd->add_flag("--chain", chain,
                  "instead: load a chain directly (no agent) with rate_limit on path 2");
    cmd->callback([] {
        // Ctrl-C ends the upload; the lab is then torn down normally.
        std::signal(SIGINT, [](int) { g_stop = true; });
        std::signal(SIGTERM, [](int) { g_stop = true; });
        try {
            set_exit_code(
                chain ? Demo(seconds).run()
                      : agent_demo(share, seconds, plot_dir, std::chrono::seconds(ready_timeout)));
        } catch (const std::exception& e) {
            spdlog::error("demo: {}", e.what());
            set_exit_code(1);
        }
    });
}

}  // namespace mpsteer::cli
