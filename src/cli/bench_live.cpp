// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer bench --live: what chains cost a real MPTCP transfer. The lab's two namespaces (two
// veth paths, no shaping, kernel MPTCP with a second subflow) move a bulk upload in rounds;
// each round runs every case once, in an order rotated round by round: nothing attached, a
// bare XDP_PASS program on every interface of both hosts, and chains under test on both hosts.
// Figures are medians over rounds; ratios are per round (both sides from the same round) and
// then their median, so a disturbed round moves both sides of its ratio. CPU is the kernel's
// accounting of the whole machine (/proc/stat), so CPU per GB holds when the link is not the
// bottleneck.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sstream>
#include <thread>

#include "cli/bench_live.h"
#include "datapath/datapath.h"
#include "lab/lab.h"

namespace mpsteer::cli {
namespace {
using namespace mpsteer::datapath;
using namespace mpsteer::lab;
using namespace std::chrono_literals;

constexpr uint16_t kPort = 5201;

// Busy jiffies of every CPU (all but idle and iowait), from the first line of /proc/stat.
uint64_t busy_jiffies() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    uint64_t v[10] = {};
    in >> cpu;
    for (auto& x : v) in >> x;
    uint64_t all = 0;
    for (auto x : v) all += x;
    return all - v[3] - v[4];
}

mps_step cidr(mps_prog prog, const char* addr, uint8_t prefix, uint16_t next) {
    auto s = make_step(prog, next, MPS_PC_END);
    s.p.cidr.family = 4;
    s.p.cidr.prefix = prefix;
    s.p.cidr.mask[0] = htonl(prefix ? ~0u << (32 - prefix) : 0);
    inet_pton(AF_INET, addr, &s.p.cidr.addr[0]);
    s.p.cidr.addr[0] &= s.p.cidr.mask[0];
    return s;
}

// dst, port, packet_type, record on every packet (match), then rate_limit on ACKs: a rate no
// lab path reaches, so the window it writes never holds the transfer back and the figure is
// the chain's cost alone. With miss, the first selector never matches.
ChainSet chain4(bool with_rate, bool miss) {
    ChainSet c;
    c.policies = {"bench"};
    c.steps.push_back(cidr(MPS_SEL_DST, miss ? "10.9.0.0" : "10.0.0.0", 16, 1));
    auto port = make_step(MPS_SEL_PORT, 2, MPS_PC_END);
    port.p.port = {MPS_DIR_EITHER, 0, kPort, kPort};
    c.steps.push_back(port);
    auto kinds = make_step(MPS_SEL_PACKET_TYPE, 3, MPS_PC_END);
    kinds.p.kinds.any_of = MPS_K_ACK | MPS_K_SYN;
    c.steps.push_back(kinds);
    c.steps.push_back(make_step(MPS_ACT_RECORD, with_rate ? 4 : MPS_PC_END));
    if (with_rate) {
        auto rl = make_step(MPS_ACT_RATE_LIMIT, MPS_PC_END);
        rl.p.rate = {uint64_t(40) * 1000 * 1000 * 1000 / 8, 1000, 64 * 1024};
        c.steps.push_back(rl);
    }
    for (Hook h : {Hook::xdp, Hook::tc_egress}) c.entries.push_back({h, "", 0});
    return c;
}

// What one case attaches in one namespace: a generation of its own (own pin root, own state
// maps: each namespace is a host) and its links. Detached on destruction.
class Attached {
public:
    // chains empty: the bare XDP_PASS program on XDP of every interface.
    Attached(const std::optional<ChainSet>& chains, const std::string& netns,
             const std::vector<std::string>& ifnames, const std::string& pin_root)
        : netns_(netns), pin_root_(pin_root) {
        try {
            state_ = StateMaps::open(pin_root_);
            NetnsGuard in(netns_);
            if (!chains) {
                gen_ = Generation::build(chain4(false, true), 1, state_, {"bench_bare_pass"});
                for (const auto& i : ifnames)
                    links_.push_back(
                        HookLink::attach(i, Hook::xdp, gen_->prog_fd("bench_bare_pass")));
                return;
            }
            gen_ = Generation::build(*chains, 1, state_);
            for (const auto& e : chains->entries)
                for (const auto& i : ifnames)
                    links_.push_back(HookLink::attach(i, e.hook, gen_->entry_fd(e.hook, i)));
        } catch (...) {
            clear();
            throw;
        }
    }
    ~Attached() { clear(); }
    Attached(const Attached&) = delete;
    Attached& operator=(const Attached&) = delete;
    uint64_t packets() const { return gen_ ? gen_->gen_counters().values[MPS_GC_PACKETS] : 0; }

private:
    void clear() {
        try {
            NetnsGuard in(netns_);
            links_.clear();
        } catch (const std::exception& e) {
            spdlog::warn("bench: detaching in {}: {}", netns_, e.what());
        }
        links_.clear();
        gen_.reset();
        state_ = StateMaps{};
        std::error_code ec;
        std::filesystem::remove_all(pin_root_, ec);
    }
    std::string netns_, pin_root_;
    StateMaps state_;
    std::unique_ptr<Generation> gen_;
    std::vector<std::unique_ptr<HookLink>> links_;
};

struct Case {
    std::string key;
    std::optional<ChainSet> chains;  // nullopt with bare: the bare program
    bool bare = false;
    std::vector<double> gbps, cpu_s_per_gb, packets;
};

struct Sample {
    double gbps = 0, cpu_s_per_gb = 0, packets = 0;
};

Sample transfer(const Lab& lab, std::chrono::seconds length) {
    Sink sink(lab.server_ns(), kPort);
    const long hz = sysconf(_SC_CLK_TCK);
    const uint64_t busy0 = busy_jiffies();
    const auto t0 = std::chrono::steady_clock::now();
    auto sent = send_stream(
        lab.client_ns(), Lab::server_addr(1), kPort,
        SendOptions::of_time(std::chrono::duration_cast<std::chrono::milliseconds>(length)));
    auto got = sink.wait(30s);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = double(busy_jiffies() - busy0) / double(hz);
    if (got.checksum != sent.checksum) throw lab::Error("bench: the stream arrived damaged");
    if (got.subflows < 1) spdlog::warn("bench: the transfer ran on one subflow");
    Sample s;
    s.gbps = double(got.bytes) * 8 / secs / 1e9;
    s.cpu_s_per_gb = got.bytes ? cpu / (double(got.bytes) / 1e9) : 0;
    return s;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int run_live_bench(bool json, int rounds, int seconds) {
    init_libbpf_logging();
    LabConfig cfg;
    cfg.tag = "b" + std::to_string(getpid() % 1000000);
    cfg.ipv6 = false;
    Lab lab(cfg);
    const std::vector<std::string> client_ifs = {lab.client_if(1), lab.client_if(2)};
    const std::vector<std::string> server_ifs = {lab.server_if(1), lab.server_if(2)};

    std::vector<Case> cases;
    cases.push_back({"none", std::nullopt, false, {}, {}, {}});
    cases.push_back({"bare_xdp", std::nullopt, true, {}, {}, {}});
    cases.push_back({"chain4_rate_limit", chain4(true, false), false, {}, {}, {}});
    cases.push_back({"chain4_nomatch", chain4(false, true), false, {}, {}, {}});
    const std::string root = "/sys/fs/bpf/mpsteer-bench-live-" + std::to_string(getpid());

    for (int round = 0; round < rounds; ++round) {
        for (size_t k = 0; k < cases.size(); ++k) {
            Case& c = cases[(k + size_t(round)) % cases.size()];
            std::unique_ptr<Attached> cli, srv;
            if (c.bare || c.chains) {
                cli = std::make_unique<Attached>(c.chains, lab.client_ns(), client_ifs,
                                                 root + "-cli");
                srv = std::make_unique<Attached>(c.chains, lab.server_ns(), server_ifs,
                                                 root + "-srv");
            }
            Sample s = transfer(lab, std::chrono::seconds(seconds));
            s.packets = cli ? double(cli->packets() + srv->packets()) : 0;
            c.gbps.push_back(s.gbps);
            c.cpu_s_per_gb.push_back(s.cpu_s_per_gb);
            c.packets.push_back(s.packets);
            if (!json)
                std::cerr << "round " << round + 1 << "/" << rounds << " " << c.key << ": "
                          << s.gbps << " Gbit/s, " << s.cpu_s_per_gb << " CPU s/GB\n";
        }
    }

    const Case& bare = cases[1];
    auto ratios = [&](const std::vector<double>& of, const std::vector<double>& to) {
        std::vector<double> r;
        for (size_t i = 0; i < of.size(); ++i) r.push_back(to[i] > 0 ? of[i] / to[i] : 0);
        return r;
    };
    nlohmann::ordered_json out;
    out["rounds"] = rounds;
    out["seconds_per_transfer"] = seconds;
    for (const auto& c : cases) {
        nlohmann::ordered_json j;
        j["gbit_per_s"] = median(c.gbps);
        j["cpu_s_per_gb"] = median(c.cpu_s_per_gb);
        if (c.chains) j["packets_through_chains_per_round"] = median(c.packets);
        if (&c != &bare) {
            auto t = ratios(c.gbps, bare.gbps), u = ratios(c.cpu_s_per_gb, bare.cpu_s_per_gb);
            j["throughput_vs_bare_xdp"] = median(t);
            j["throughput_vs_bare_xdp_min"] = *std::min_element(t.begin(), t.end());
            j["throughput_vs_bare_xdp_max"] = *std::max_element(t.begin(), t.end());
            j["cpu_per_gb_vs_bare_xdp"] = median(u);
        }
        out[c.key] = j;
    }
    if (json) {
        std::cout << out.dump() << '\n';
    } else {
        std::cout << out.dump(2) << '\n'
                  << "targets: chain4_rate_limit throughput_vs_bare_xdp >= 0.97 and "
                     "cpu_per_gb_vs_bare_xdp <= 1.03; chain4_nomatch throughput >= 0.99\n";
    }
    return 0;
}

}  // namespace mpsteer::cli
