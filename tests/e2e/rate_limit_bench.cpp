// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// How close rate_limit holds a transfer to its configured rate, over a matrix of path RTT x
// configured rate. Each cell: a two-namespace lab with one path (the server announces nothing:
// one subflow) whose one-way delay is half the RTT (the delay line; none for the shortest),
// the server running a policy compiled from a manifest (record at XDP and TC egress, which
// measures the RTT, and rate_limit at TC egress: the server lowers the window of its own ACKs),
// an upload of --seconds, and the goodput from 2 s on (slow start and the first RTT samples
// are over) as the sink counts it. Prints one line per cell and a table. Root required.
//
//   rate_limit_bench [--rtt-ms 0.1,1,10,50] [--rates-mbit 5,50,500] [--seconds 8]
//
// A cell whose path cannot carry the rate (the delay line relays frames in user space) is
// marked: the unshaped path's own goodput is measured first at each RTT.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "compile/compile.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<double> numbers(const std::string& list) {
    std::vector<double> out;
    std::istringstream in(list);
    for (std::string x; std::getline(in, x, ',');) out.push_back(std::stod(x));
    return out;
}

// Goodput in bit/s of an upload from 2 s to 1 s before its end, with `chains` (if any) on the
// server.
double goodput(const Lab& lab, const datapath::ChainSet* chains, int seconds) {
    std::unique_ptr<Steering> steer;
    if (chains)
        steer = std::make_unique<Steering>(*chains, lab.server_ns(),
                                           Steering::pin_root_for("ratebench"));
    Sink sink(lab.server_ns(), 5201);
    std::thread sender([&] {
        send_stream(lab.client_ns(), Lab::server_addr(1), 5201,
                    SendOptions::of_time(std::chrono::seconds(seconds)));
    });
    std::this_thread::sleep_for(2s);
    const auto t0 = Clock::now();
    const uint64_t b0 = sink.bytes_so_far();
    std::this_thread::sleep_for(std::chrono::seconds(seconds - 3));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const uint64_t b1 = sink.bytes_so_far();
    steer.reset();  // what the sender still holds leaves at the path's speed
    sender.join();
    sink.wait(60s);
    return 8.0 * double(b1 - b0) / dt;
}

datapath::ChainSet limit_chains(const Lab& lab, double rate_mbit, double rtt_ms) {
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{lab.server_if(1), lab.server_if(2)};
    o.check_scripts = false;
    char rate[32], rtt[32];
    std::snprintf(rate, sizeof rate, "%.0fkbit", rate_mbit * 1000);
    std::snprintf(rtt, sizeof rtt, "%.0fus", std::max(1.0, rtt_ms * 1000));
    const std::string head = "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: ";
    const std::string yaml =
        head + "measure}\nspec:\n  attach: {interfaces: [" + lab.server_if(1) +
        "], hooks: [xdp, tc_egress]}\n  priority: 1\n  continue: true\n  actions:\n"
        "    - record: {}\n---\n" +
        head + "limit}\nspec:\n  attach: {interfaces: [" + lab.server_if(1) +
        "], hooks: [tc_egress]}\n  priority: 2\n  actions:\n    - rate_limit: {rate: " + rate +
        ", rtt: " + rtt + "}\n";
    auto loaded = manifest::load_sources({{"limit.yaml", yaml}}, o);
    if (!loaded.ok()) {
        std::string msg;
        for (const auto& d : loaded.diagnostics) msg += d.format() + "\n";
        throw Error("rate_limit_bench: manifest: " + msg);
    }
    return compile::compile(loaded.model).chains;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<double> rtts = {0.1, 1, 10, 50}, rates = {5, 50, 500};
    int seconds = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--rtt-ms"))
            rtts = numbers(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--rates-mbit"))
            rates = numbers(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--seconds"))
            seconds = std::max(4, std::atoi(argv[i + 1]));
        else {
            std::cerr << "usage: rate_limit_bench [--rtt-ms LIST] [--rates-mbit LIST] "
                         "[--seconds N]\n";
            return 2;
        }
    }
    try {
        datapath::init_libbpf_logging();
        Lab::cleanup_stale();
        struct Cell {
            double rtt, rate, path, got;
        };
        std::vector<Cell> cells;
        for (double rtt : rtts) {
            LabConfig cfg;
            cfg.tag = "rb" + std::to_string(getpid() % 100000);
            cfg.signal = false;  // one subflow: the rate is the connection's
            // The shortest RTT is the veth's own (tens of microseconds, no delay line).
            const unsigned delay = rtt >= 1 ? unsigned(std::lround(rtt / 2)) : 0;
            cfg.path[0] = cfg.path[1] = PathShape{delay, 0};
            Lab lab(cfg);
            const double path = goodput(lab, nullptr, seconds);
            std::printf("rtt %.1f ms: the path alone carries %.1f Mbit/s\n", rtt, path / 1e6);
            for (double rate : rates) {
                auto chains = limit_chains(lab, rate, rtt);
                const double got = goodput(lab, &chains, seconds);
                cells.push_back({rtt, rate, path, got});
                std::printf("rtt %.1f ms, rate %.0f Mbit/s: %.2f Mbit/s (%+.1f %%)%s\n", rtt, rate,
                            got / 1e6, 100 * (got / (rate * 1e6) - 1),
                            rate * 1e6 > 0.9 * path ? " (beyond the path)" : "");
                std::fflush(stdout);
            }
        }
        std::printf("\n| RTT | configured | achieved | error |\n|---|---|---|---|\n");
        for (const auto& c : cells)
            std::printf(
                "| %.1f ms | %.0f Mbit/s | %.2f Mbit/s | %s |\n", c.rtt, c.rate, c.got / 1e6,
                c.rate * 1e6 > 0.9 * c.path
                    ? "beyond the path"
                    : (std::to_string(int(std::lround(100 * (c.got / (c.rate * 1e6) - 1)))) + " %")
                          .c_str());
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
    return 0;
}
