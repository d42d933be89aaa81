// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer bench --live: what chains cost a real MPTCP transfer. The lab's two namespaces (two
// veth paths, no shaping, kernel MPTCP with a second subflow) move a bulk upload in rounds;
// each round runs every case once, in an order rotated round by round: nothing attached, a
// bare XDP_PASS program on every interface of both hosts, chains under test on both hosts, and
// the real agent with the shipped policies on the client (the demo's setup; the server keeps
// the bare program, so both sides of that ratio pay the same on the server).
// Figures are medians over rounds; ratios are per round (both sides from the same round) and
// then their median, so a disturbed round moves both sides of its ratio. CPU is the kernel's
// accounting of the whole machine (/proc/stat), so CPU per GB holds when the link is not the
// bottleneck.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sstream>
#include <thread>

#include "testbed/agent_process.h"
#include "cli/commands.h"
#include "datapath/datapath.h"
#include "lab/lab.h"
#include "net/stats.h"

namespace mpsteer::cli {
namespace {
using namespace mpsteer::datapath;
using namespace mpsteer::lab;
using mpsteer::net::median;
using namespace std::chrono_literals;

constexpr uint16_t kPort = 5201;

// Jiffies this machine's CPUs ran anything: user, nice, system, irq, softirq (/proc/stat's
// first line). Not idle or iowait; not steal (the hypervisor running other guests: not this
// machine's work); not guest, which user already holds.
uint64_t busy_jiffies() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    uint64_t v[10] = {};
    in >> cpu;
    for (auto& x : v) in >> x;
    return v[0] + v[1] + v[2] + v[5] + v[6];
}

// A chain of the benchmark: the selectors dst, port, packet_type (every packet matches them;
// with miss, dst never does), then record on every packet, then rate_limit on ACKs with a
// minimum window no TCP window reaches: it does all its work on every ACK but never lowers a
// window (the lab's RTT samples are tens of microseconds, so any rate would), and the figure
// is the chain's cost alone, not a cap. On the hooks given. Without selectors the actors run on
// every TCP packet.
struct ChainShape {
    bool selectors = true, miss = false, record = true, rate = false;
    std::vector<Hook> hooks = {Hook::xdp, Hook::tc_egress};
};

ChainSet bench_chain(const ChainShape& shape) {
    ChainSet c;
    c.policies = {"bench"};
    auto next = [&] { return static_cast<uint16_t>(c.steps.size() + 1); };
    if (shape.selectors) {
        c.steps.push_back(cidr4_step(MPS_W_DST, shape.miss ? "10.9.0.0" : "10.0.0.0", 16, next()));
        c.steps.push_back(port_match(PortDir::either, kPort, kPort).step(next()));
        c.steps.push_back(kinds_match(MPS_K_ACK | MPS_K_SYN).step(next()));
    }
    if (shape.record) c.steps.push_back(make_step(MPS_ACT_RECORD, next()));
    if (shape.rate) {
        auto rl = make_step(MPS_ACT_RATE_LIMIT, next());
        rl.p.rate = {MPS_RATE_MAX, 1000, 1u << 30};
        c.steps.push_back(rl);
    }
    if (c.steps.empty()) c.steps.push_back(make_step(MPS_ACT_PASS, MPS_PC_END));
    c.steps.back().on_match = MPS_PC_END;
    for (Hook h : shape.hooks) c.entries.push_back({h, "", 0});
    return c;
}

// What one case attaches in one namespace: a generation of its own (own pin root, own state
// maps: each namespace is a host) and its links. Detached on destruction.
class Attached {
public:
    // chains empty: the bare XDP_PASS program on XDP of every interface; so too when the
    // chains have no XDP entry (every case pays XDP's cost on veth alike).
    Attached(const std::optional<ChainSet>& chains, const std::string& netns,
             const std::vector<std::string>& ifnames, const std::string& pin_root)
        : netns_(netns), pin_root_(pin_root) {
        try {
            state_ = StateMaps::open(pin_root_);
            NetnsGuard in(netns_);
            const ChainSet none = bench_chain({.miss = true});
            gen_ = Generation::build(chains ? *chains : none, 1, state_, {"bench_bare_pass"});
            bool xdp = false;
            for (const auto& e : chains ? chains->entries : std::vector<EntryPoint>{}) {
                xdp |= e.hook == Hook::xdp;
                for (const auto& i : ifnames)
                    links_.push_back(HookLink::attach(i, e.hook, gen_->entry_fd(e.hook, i)));
            }
            if (!xdp)
                for (const auto& i : ifnames)
                    links_.push_back(
                        HookLink::attach(i, Hook::xdp, gen_->prog_fd("bench_bare_pass")));
        } catch (...) {
            clear();
            throw;
        }
    }
    ~Attached() { clear(); }
    Attached(const Attached&) = delete;
    Attached& operator=(const Attached&) = delete;
    // Packets that entered the chains on any hook (a GSO or GRO packet counts once).
    uint64_t packets() const { return gen_->gen_counters().values[MPS_GC_PACKETS]; }
    // Windows a rate_limit step lowered (the benchmark's chains lower none).
    uint64_t windows_lowered() const {
        uint64_t n = 0;
        const auto counters = gen_->step_counters();
        const auto& steps = gen_->chains().steps;
        for (size_t pc = 0; pc < steps.size() && pc < counters.size(); ++pc)
            if (steps[pc].prog == MPS_ACT_RATE_LIMIT) n += counters[pc].matched;
        return n;
    }

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

// Run time and runs so far of what a host's interfaces run on each hook (the program attached,
// whichever attached it, with every program it tail-calls); the kernel counts while
// BPF_STATS_RUN_TIME is enabled.
struct ProgTime {
    uint64_t ns = 0, runs = 0;
};
std::map<Hook, ProgTime> prog_times_of(const std::string& netns,
                                       const std::vector<std::string>& ifs) {
    NetnsGuard in(netns);
    std::map<Hook, std::set<uint32_t>> ids;  // a program shared by interfaces counts once
    for (const auto& i : ifs)
        for (Hook h : kHooks)
            for (uint32_t id : attached_programs(i, h)) ids[h].insert(id);
    std::map<Hook, ProgTime> out;
    for (const auto& [hook, set] : ids) {
        ProgTime& t = out[hook];
        for (uint32_t id : set) {
            Fd fd(bpf_prog_get_fd_by_id(id));
            bpf_prog_info info{};
            uint32_t len = sizeof info;
            if (!fd || bpf_obj_get_info_by_fd(fd.get(), &info, &len)) continue;
            t.ns += info.run_time_ns;
            t.runs += info.run_cnt;
        }
    }
    return out;
}

struct Case {
    std::string key;
    std::optional<ChainSet> chains;  // nullopt with bare: the bare program
    bool bare = false;
    bool shipped = false;  // the agent with the shipped policies on the client
    bool iperf3 = false;   // iperf3 moves the data instead of the lab's sender, nothing attached
    std::vector<double> gbps, cpu_s_per_gb;
    std::map<std::string, std::vector<double>> counts;  // "client_xdp_frames" -> per round
};

struct Sample {
    double gbps = 0, cpu_s_per_gb = 0, gb = 0;
    int extra_subflows = 0;  // the receiver's (iperf3: the joins it received meanwhile)
};

// Frames the interfaces of a host received: what its XDP programs ran on, one by one.
uint64_t rx_frames(const std::string& netns, const std::vector<std::string>& ifnames) {
    uint64_t n = 0;
    for (const auto& i : ifnames) n += link_counters(netns, i).rx_packets;
    return n;
}

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
    s.gb = double(got.bytes) / 1e9;
    s.cpu_s_per_gb = got.bytes ? cpu / s.gb : 0;
    s.extra_subflows = int(got.subflows);
    return s;
}

// The same upload by iperf3 (MPTCP on both ends through the shim, mptcp_shim.c) to `port`:
// what the paths carry with a sender built for speed, beside the lab's own.
Sample iperf3_transfer(const Lab& lab, std::chrono::seconds length, uint16_t port_number) {
    const std::string shim = companion_binary("libmpsteer-mptcp-shim.so");
    if (shim.empty())
        throw lab::Error(
            "bench: the iperf3 case needs libmpsteer-mptcp-shim.so beside mpsteer-lab (the "
            "build tree's src/cli; it is not packaged)");
    const std::string port = std::to_string(port_number),
                      limit = std::to_string(length.count() + 30);
    // Its control connection is MPTCP too and may be joined as well: both count.
    const uint64_t joins0 = mptcp_counters(lab.server_ns())["MPJoinAckRx"];
    std::string server_error;
    std::thread server([&] {
        try {
            must_in(lab.server_ns(), {"timeout", limit, "env", "LD_PRELOAD=" + shim, "iperf3", "-s",
                                      "-1", "-p", port});
        } catch (const std::exception& e) {
            server_error = e.what();
        }
    });
    std::this_thread::sleep_for(500ms);  // listening
    const long hz = sysconf(_SC_CLK_TCK);
    const uint64_t busy0 = busy_jiffies();
    std::string out;
    try {
        out = must_in(lab.client_ns(), {"timeout", limit, "env", "LD_PRELOAD=" + shim, "iperf3",
                                        "-c", Lab::server_addr(1), "-p", port, "-t",
                                        std::to_string(length.count()), "-J"});
    } catch (...) {
        server.join();
        throw;
    }
    const double cpu = double(busy_jiffies() - busy0) / double(hz);
    server.join();
    if (!server_error.empty()) throw lab::Error("bench: iperf3's server: " + server_error);
    const auto open = out.find('{'), close = out.rfind('}');
    if (open == std::string::npos || close == std::string::npos || close < open)
        throw lab::Error("bench: iperf3 printed no JSON: " + out);
    const auto j = nlohmann::json::parse(out.substr(open, close - open + 1));
    const auto& got = j.at("end").at("sum_received");
    Sample s;
    s.gb = got.at("bytes").get<double>() / 1e9;
    s.gbps = got.at("bits_per_second").get<double>() / 1e9;
    s.cpu_s_per_gb = s.gb > 0 ? cpu / s.gb : 0;
    s.extra_subflows = int(mptcp_counters(lab.server_ns())["MPJoinAckRx"] - joins0);
    return s;
}

// What a process holds and has run: resident memory (VmRSS) and CPU seconds (user + system).
struct ProcessUse {
    double rss_mb = 0, cpu_s = 0;
};
ProcessUse process_use(pid_t pid) {
    ProcessUse u;
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmRSS:", 0) == 0) u.rss_mb = std::stod(line.substr(6)) / 1024;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    std::istringstream rest(text.substr(text.rfind(')') + 2));
    std::vector<std::string> f((std::istream_iterator<std::string>(rest)), {});
    if (f.size() > 12)
        u.cpu_s = double(std::stoull(f[11]) + std::stoull(f[12])) / double(sysconf(_SC_CLK_TCK));
    return u;
}

const std::vector<std::string>& live_bench_cases() {
    static const std::vector<std::string> names = {
        "chain4_rate_limit", "chain4_nomatch",  "shipped_policies", "selectors_only",
        "record_only",       "chain4_xdp_only", "chain4_tc_only",   "iperf3"};
    return names;
}

int run_live_bench(bool json, int rounds, int seconds, const std::string& share,
                   const std::vector<std::string>& chosen, bool prog_times, bool by_iperf3) {
    if (by_iperf3 && std::find(chosen.begin(), chosen.end(), "iperf3") != chosen.end())
        throw std::invalid_argument(
            "--sender iperf3 moves every case's data with iperf3: the iperf3 case would repeat "
            "none");
    for (const auto& n : chosen)
        if (std::find(live_bench_cases().begin(), live_bench_cases().end(), n) ==
            live_bench_cases().end())
            throw std::invalid_argument("no live benchmark case " + n);
    init_libbpf_logging();
    LabConfig cfg;
    cfg.tag = "b" + std::to_string(getpid() % 1000000);
    cfg.ipv6 = false;
    Lab lab(cfg);
    const std::vector<std::string> client_ifs = {lab.client_if(1), lab.client_if(2)};
    const std::vector<std::string> server_ifs = {lab.server_if(1), lab.server_if(2)};
    struct Host {
        std::string name, netns;
        std::vector<std::string> ifs;
    };
    const std::array<Host, 2> hosts = {Host{"client", lab.client_ns(), client_ifs},
                                       Host{"server", lab.server_ns(), server_ifs}};

    std::vector<Case> cases;
    auto add = [&](const char* key, std::optional<ChainSet> chains, bool bare, bool shipped) {
        Case c;
        c.key = key;
        c.chains = std::move(chains);
        c.bare = bare;
        c.shipped = shipped;
        cases.push_back(std::move(c));
    };
    add("none", std::nullopt, false, false);
    add("bare_xdp", std::nullopt, true, false);
    for (const auto& n : chosen) {
        ChainShape shape;
        if (n == "chain4_rate_limit") {
            shape.rate = true;
        } else if (n == "chain4_nomatch") {
            shape.miss = true;
        } else if (n == "shipped_policies") {
            add("shipped_policies", std::nullopt, false, true);
            continue;
        } else if (n == "iperf3") {
            add("iperf3", std::nullopt, false, false);
            cases.back().iperf3 = true;
            continue;
        } else if (n == "selectors_only") {
            shape.record = false;
        } else if (n == "record_only") {
            shape.selectors = false;
        } else if (n == "chain4_xdp_only") {
            shape.rate = true;
            shape.hooks = {Hook::xdp};
        } else if (n == "chain4_tc_only") {
            shape.rate = true;
            shape.hooks = {Hook::tc_egress};
        }
        add(n.c_str(), bench_chain(shape), false, false);
    }
    const std::string root = "/sys/fs/bpf/mpsteer-bench-live-" + std::to_string(getpid());
    // The kernel times every program run while this descriptor is open (two clock reads per
    // run, on the bare program too).
    Fd stats;
    if (prog_times) {
        int fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
        if (fd < 0) throw lab::Error("enabling the kernel's BPF run-time statistics failed");
        stats = Fd(fd);
    }

    for (int round = 0; round < rounds; ++round) {
        for (size_t k = 0; k < cases.size(); ++k) {
            Case& c = cases[(k + size_t(round)) % cases.size()];
            std::unique_ptr<Attached> cli, srv;
            std::unique_ptr<ShippedAgent> agent;
            if (c.bare || c.chains) {
                cli = std::make_unique<Attached>(c.chains, lab.client_ns(), client_ifs,
                                                 root + "-cli");
                srv = std::make_unique<Attached>(c.chains, lab.server_ns(), server_ifs,
                                                 root + "-srv");
            } else if (c.shipped) {
                std::vector<std::string> leave_out;  // as the demo runs them
                for (const auto& e : shipped_elsewhere()) leave_out.push_back(e.file);
                agent = std::make_unique<ShippedAgent>(
                    share, lab.client_ns(), "bench-live-" + std::to_string(getpid()), leave_out);
                agent->wait_ready();
                srv = std::make_unique<Attached>(std::nullopt, lab.server_ns(), server_ifs,
                                                 root + "-srv");
            }
            // Counters from zero for this transfer (the agent's keep counting while it runs):
            // packets its chains saw and, per shipped policy, what it applied (windows
            // lowered, subflows blocked or added: their cost is more than the chains' when
            // they act). One read of the status for both.
            struct AgentCounts {
                uint64_t packets = 0;
                std::map<std::string, uint64_t> applied;
            };
            auto agent_counts = [&] {
                AgentCounts n;
                const nlohmann::json st = agent->status();
                n.packets = st.value("datapath", nlohmann::json::object()).value("packets", 0ull);
                for (const auto& p : st.value("policies", nlohmann::json::array()))
                    n.applied[p.value("name", "")] = p.value("applied", uint64_t(0));
                return n;
            };
            const AgentCounts agent0 = agent ? agent_counts() : AgentCounts{};
            const ProcessUse agent_use0 = agent ? process_use(agent->pid()) : ProcessUse{};
            std::array<uint64_t, 2> rx0;
            std::array<std::map<Hook, ProgTime>, 2> times0;
            for (size_t h = 0; h < hosts.size(); ++h) {
                rx0[h] = rx_frames(hosts[h].netns, hosts[h].ifs);
                if (prog_times) times0[h] = prog_times_of(hosts[h].netns, hosts[h].ifs);
            }
            // The iperf3 case beside the lab's sender on a port of its own.
            Sample s = by_iperf3 || c.iperf3 ? iperf3_transfer(lab, std::chrono::seconds(seconds),
                                                               by_iperf3 ? kPort : kPort + 1)
                                             : transfer(lab, std::chrono::seconds(seconds));
            if (c.bare || c.chains || c.shipped)
                for (size_t h = 0; h < hosts.size(); ++h)
                    c.counts[hosts[h].name + "_xdp_frames"].push_back(
                        double(rx_frames(hosts[h].netns, hosts[h].ifs) - rx0[h]));
            if (prog_times) {
                // The programs' own run time per GB moved: with the whole machine's CPU per
                // GB it shows whether the programs' instructions are what a case costs.
                double prog_ns = 0;
                for (size_t h = 0; h < hosts.size(); ++h) {
                    for (const auto& [hook, t] : prog_times_of(hosts[h].netns, hosts[h].ifs)) {
                        const ProgTime was =
                            times0[h].count(hook) ? times0[h].at(hook) : ProgTime{};
                        const double ns = double(t.ns - was.ns), runs = double(t.runs - was.runs);
                        prog_ns += ns;
                        if (runs > 0)
                            c.counts[hosts[h].name + "_" + std::string(to_string(hook)) +
                                     "_ns_per_run"]
                                .push_back(ns / runs);
                    }
                }
                c.counts["programs_cpu_s_per_gb"].push_back(s.gb > 0 ? prog_ns / 1e9 / s.gb : 0);
            }
            if (c.chains) {
                c.counts["client_chain_packets"].push_back(double(cli->packets()));
                c.counts["server_chain_packets"].push_back(double(srv->packets()));
                c.counts["windows_lowered"].push_back(
                    double(cli->windows_lowered() + srv->windows_lowered()));
            }
            if (agent) {
                // The agent's own CPU while the data moved (its hooks, events, status): part
                // of the machine's, not of the programs'.
                const double agent_s = process_use(agent->pid()).cpu_s - agent_use0.cpu_s;
                c.counts["agent_cpu_s_per_gb"].push_back(s.gb > 0 ? agent_s / s.gb : 0);
                agent->wait_status_update(3s);
                const AgentCounts agent1 = agent_counts();
                c.counts["client_chain_packets"].push_back(double(agent1.packets - agent0.packets));
                for (const auto& [name, n] : agent1.applied) {
                    const auto was = agent0.applied.count(name) ? agent0.applied.at(name) : 0;
                    c.counts["applied_" + name].push_back(double(n - was));
                }
            }
            c.counts["extra_subflows"].push_back(s.extra_subflows);
            c.gbps.push_back(s.gbps);
            c.cpu_s_per_gb.push_back(s.cpu_s_per_gb);
            if (!json)
                std::cerr << "round " << round + 1 << "/" << rounds << " " << c.key << ": "
                          << s.gbps << " Gbit/s, " << s.cpu_s_per_gb << " CPU s/GB, "
                          << s.extra_subflows << " extra subflow(s)\n";
        }
    }

    // The agent with every shipped policy (those for other hosts too: their hooks still tick),
    // idle: Ready, hooks ticking, no traffic.
    constexpr int kIdleSeconds = 20;
    ProcessUse idle0, idle1;
    {
        ShippedAgent agent(share, lab.client_ns(), "bench-idle-" + std::to_string(getpid()));
        agent.wait_ready();
        std::this_thread::sleep_for(2s);  // past the post-apply work (compiled entries)
        idle0 = process_use(agent.pid());
        std::this_thread::sleep_for(std::chrono::seconds(kIdleSeconds));
        idle1 = process_use(agent.pid());
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
    out["sender"] = by_iperf3 ? "iperf3" : "lab";
    for (const auto& c : cases) {
        nlohmann::ordered_json j;
        j["gbit_per_s"] = median(c.gbps);
        j["cpu_s_per_gb"] = median(c.cpu_s_per_gb);
        for (const auto& [what, v] : c.counts)
            if (what.rfind("applied_", 0) != 0 || *std::max_element(v.begin(), v.end()) > 0)
                j[what] = median(v);  // policies that did something
        if (&c != &bare) {
            auto t = ratios(c.gbps, bare.gbps), u = ratios(c.cpu_s_per_gb, bare.cpu_s_per_gb);
            j["throughput_vs_bare_xdp"] = median(t);
            j["throughput_vs_bare_xdp_min"] = *std::min_element(t.begin(), t.end());
            j["throughput_vs_bare_xdp_max"] = *std::max_element(t.begin(), t.end());
            j["cpu_per_gb_vs_bare_xdp"] = median(u);
            if (c.counts.count("programs_cpu_s_per_gb") &&
                bare.counts.count("programs_cpu_s_per_gb")) {
                // Per round, what the case's programs took more than the bare program's,
                // beside what the whole machine took more: both in CPU seconds per GB.
                const auto& p = c.counts.at("programs_cpu_s_per_gb");
                const auto& pb = bare.counts.at("programs_cpu_s_per_gb");
                std::vector<double> dp, dm;
                for (size_t i = 0; i < p.size() && i < pb.size(); ++i) {
                    dp.push_back(p[i] - pb[i]);
                    dm.push_back(c.cpu_s_per_gb[i] - bare.cpu_s_per_gb[i]);
                }
                j["programs_cpu_s_per_gb_over_bare"] = median(dp);
                j["machine_cpu_s_per_gb_over_bare"] = median(dm);
            }
        }
        out[c.key] = j;
    }
    out["agent_idle"] = {{"seconds", kIdleSeconds},
                         {"rss_mb", idle1.rss_mb},
                         {"cpu_percent", (idle1.cpu_s - idle0.cpu_s) / kIdleSeconds * 100}};
    if (json) {
        std::cout << out.dump() << '\n';
    } else {
        std::cout << out.dump(2) << '\n'
                  << "targets: chain4_rate_limit throughput_vs_bare_xdp >= 0.97 and "
                     "cpu_per_gb_vs_bare_xdp <= 1.03 (shipped_policies >= 0.98 and <= 1.03); "
                     "chain4_nomatch throughput >= 0.99; agent_idle rss_mb <= 15, "
                     "cpu_percent <= 0.5\n";
    }
    return 0;
}

}  // namespace

void add_live_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "bench",
        "--live: a real MPTCP transfer through the lab: no program, a bare XDP_PASS and chains "
        "on both hosts, the agent with the shipped policies, in alternating rounds (needs root)");
    static bool json = false, live = true, prog_times = false;
    static std::string sender = "lab";
    static int rounds = 9, seconds = 4;
    cmd->add_flag("--live", live, "the live benchmark (this binary's only one: implied)");
    cmd->add_flag("--json", json, "print one JSON object");
    cmd->add_option("--rounds", rounds, "rounds per case, alternating (medians reported)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    cmd->add_option("--seconds", seconds, "length of each transfer")
        ->check(CLI::Range(1, 60))
        ->capture_default_str();
    cmd->add_flag("--prog-times", prog_times,
                  "also the kernel's run time per program run at each hook and the programs' "
                  "own CPU seconds per GB, beside the whole machine's (kernel.bpf_stats_enabled: "
                  "every run then pays two clock reads, so compare throughput only between runs "
                  "alike)");
    static std::vector<std::string> cases = {live_bench_cases().begin(),
                                             live_bench_cases().begin() + 3};
    cmd->add_option("--cases", cases,
                    "the cases beside none and bare_xdp (also: selectors_only, record_only, "
                    "chain4_xdp_only, chain4_tc_only: where a chain's cost goes; iperf3: the "
                    "same upload by iperf3 over MPTCP, the yardstick for the lab's sender)")
        ->check(CLI::IsMember(live_bench_cases()))
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--sender", sender,
                    "what moves each case's data: lab (the lab's sender and receiver, checking the "
                    "stream arrives intact) or iperf3 (MPTCP through the shim beside mpsteer-lab, "
                    "build tree only: a sender fast enough to make the path CPU-bound)")
        ->check(CLI::IsMember({"lab", "iperf3"}))
        ->capture_default_str();
    static std::string share = default_share();
    cmd->add_option("--share", share, "where the shipped policies/ and lua/ are")
        ->check(CLI::ExistingDirectory)
        ->capture_default_str();
    cmd->callback([] {
        try {
            set_exit_code(run_live_bench(json, rounds, seconds, share, cases, prog_times,
                                         sender == "iperf3"));
        } catch (const std::exception& e) {
            spdlog::error("bench: {}", e.what());
            set_exit_code(1);
        }
    });
}

}  // namespace mpsteer::cli
