// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Lua hooks benchmarks; prints figures, not a test. Root, network namespaces.
//   lua_bench latency [N]   event -> hook -> map update, p50/p99 over N connections per round,
//                           the agent's event thread (lua::EventThread) in each --events mode,
//                           the scripts in the hook process (the agent's way) and, in
//                           alternating rounds, in the event thread itself,
//                           SCHED_OTHER and SCHED_FIFO, beside the kernel's netlink path for the
//                           same kind of action (the in-kernel PM's MPTCP_PM_CMD_SET_FLAGS backup
//                           on an endpoint, request -> ack; and `ip mptcp endpoint change ...
//                           backup` as a command). LUA_BENCH_SPIN_US: adaptive's window (1000).
//                           LUA_BENCH_CPU=N: also spin pinned to CPU N (--events-cpu N), as
//                           SCHED_OTHER and SCHED_FIFO 10.
//   lua_bench ratio [PAIRS]  the default mode only (--events=wait), PAIRS alternating pairs of
//                           rounds of 100 connections, in the event thread then in the hook
//                           process: each pair's p50s and their ratio, the median ratio and its
//                           range (target: the hook process within 2x of the event thread)
//   lua_bench smallflow [N] completion time of N 100 KB uploads with and without the
//                           small-flow policy (agent on the client, paths 10 ms / 10 ms)
//   lua_bench ecf [RUNS]    100 MB upload, ECF script vs the kernel's default scheduler, two
//                           paths 20 ms and 50 ms RTT at 50 Mbit/s each, RUNS runs each
// With no argument: all three with the defaults (200, 20, 5).
#include <linux/genetlink.h>
#include <linux/mptcp.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "agent_harness.h"
#include "datapath/datapath.h"
#include "lab/lab.h"
#include "net/stats.h"
#include "lua/datapath_backend.h"
#include "lua/event_thread.h"
#include "lua/hook_process.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using mpsteer::net::quantile;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

uint64_t mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

// The datapath backend, timing each write against the event being handled (the event thread's
// before_hooks probe sets event_ns and handler_start_ns). Used only on the event thread.
// The rates the bench script's hooks return: on_subflow's tells its writes apart.
constexpr uint64_t kConnectionRate = 2500000, kSubflowRate = 1250000;

class TimedBackend : public lua::DatapathBackend {
public:
    using DatapathBackend::DatapathBackend;
    uint64_t event_ns = 0, handler_start_ns = 0;
    std::vector<double> total_us, agent_us;  // event -> written; handler start -> written
    std::vector<double> delivery_us;         // event -> handler start (every event)
    std::vector<double> subflow_total_us;    // the part of total_us from on_subflow's writes
    bool set_subflow(const std::string& p, uint64_t id, const lua::SubflowSettings& s) override {
        bool ok = DatapathBackend::set_subflow(p, id, s);
        uint64_t now = mono_ns();
        if (ok && event_ns) {
            total_us.push_back((now - event_ns) / 1e3);
            if (s.rate == kSubflowRate) subflow_total_us.push_back(total_us.back());
            agent_us.push_back((now - handler_start_ns) / 1e3);
        }
        return ok;
    }
};

// ---- generic netlink: MPTCP_PM_CMD_SET_FLAGS -----------------------------------------------

struct Genl {
    int fd = -1;
    uint16_t family = 0;
    uint32_t seq = 1;
    Genl() {
        fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC);
        if (fd < 0) throw std::runtime_error("genl socket");
        char buf[256] = {};
        auto* nh = reinterpret_cast<nlmsghdr*>(buf);
        auto* gh = static_cast<genlmsghdr*>(NLMSG_DATA(nh));
        gh->cmd = CTRL_CMD_GETFAMILY;
        gh->version = 1;
        auto* a = reinterpret_cast<nlattr*>(reinterpret_cast<char*>(gh) + GENL_HDRLEN);
        const char* name = MPTCP_PM_NAME;
        a->nla_type = CTRL_ATTR_FAMILY_NAME;
        a->nla_len = uint16_t(NLA_HDRLEN + std::strlen(name) + 1);
        std::memcpy(reinterpret_cast<char*>(a) + NLA_HDRLEN, name, std::strlen(name) + 1);
        nh->nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN + NLA_ALIGN(a->nla_len));
        nh->nlmsg_type = GENL_ID_CTRL;
        nh->nlmsg_flags = NLM_F_REQUEST;
        nh->nlmsg_seq = seq++;
        send(fd, buf, nh->nlmsg_len, 0);
        char rb[8192];
        ssize_t n = recv(fd, rb, sizeof rb, 0);
        auto* rh = reinterpret_cast<nlmsghdr*>(rb);
        if (n <= 0 || rh->nlmsg_type == NLMSG_ERROR) throw std::runtime_error("mptcp_pm family");
        int len = int(rh->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN));
        auto* ra = reinterpret_cast<nlattr*>(static_cast<char*>(NLMSG_DATA(rh)) + GENL_HDRLEN);
        while (len >= NLA_HDRLEN) {
            if (ra->nla_type == CTRL_ATTR_FAMILY_ID)
                std::memcpy(&family, reinterpret_cast<char*>(ra) + NLA_HDRLEN, 2);
            len -= NLA_ALIGN(ra->nla_len);
            ra = reinterpret_cast<nlattr*>(reinterpret_cast<char*>(ra) + NLA_ALIGN(ra->nla_len));
        }
        if (!family) throw std::runtime_error("mptcp_pm family id");
    }
    ~Genl() { close(fd); }
    // Endpoint `id` backup on/off; returns the kernel's answer (0: ok, -errno).
    int set_backup(uint8_t id, bool backup) {
        char buf[256] = {};
        auto* nh = reinterpret_cast<nlmsghdr*>(buf);
        auto* gh = static_cast<genlmsghdr*>(NLMSG_DATA(nh));
        gh->cmd = MPTCP_PM_CMD_SET_FLAGS;
        gh->version = MPTCP_PM_VER;
        char* p = reinterpret_cast<char*>(gh) + GENL_HDRLEN;
        auto* nest = reinterpret_cast<nlattr*>(p);
        nest->nla_type = MPTCP_PM_ATTR_ADDR | NLA_F_NESTED;
        char* q = p + NLA_HDRLEN;
        auto* aid = reinterpret_cast<nlattr*>(q);
        aid->nla_type = MPTCP_PM_ADDR_ATTR_ID;
        aid->nla_len = NLA_HDRLEN + 1;
        q[NLA_HDRLEN] = char(id);
        q += NLA_ALIGN(aid->nla_len);
        auto* af = reinterpret_cast<nlattr*>(q);
        af->nla_type = MPTCP_PM_ADDR_ATTR_FLAGS;
        af->nla_len = NLA_HDRLEN + 4;
        uint32_t flags = backup ? MPTCP_PM_ADDR_FLAG_BACKUP : 0;
        std::memcpy(q + NLA_HDRLEN, &flags, 4);
        q += NLA_ALIGN(af->nla_len);
        nest->nla_len = uint16_t(q - p);
        nh->nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN + (q - p));
        nh->nlmsg_type = family;
        nh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
        nh->nlmsg_seq = seq++;
        if (send(fd, buf, nh->nlmsg_len, 0) < 0) return -errno;
        char rb[4096];
        ssize_t n = recv(fd, rb, sizeof rb, 0);
        if (n <= 0) return -EIO;
        auto* rh = reinterpret_cast<nlmsghdr*>(rb);
        if (rh->nlmsg_type == NLMSG_ERROR) return static_cast<nlmsgerr*>(NLMSG_DATA(rh))->error;
        return 0;
    }
};

void print_row(const char* what, const std::vector<double>& v) {
    std::printf("  %-58s n=%4zu  p50 %8.1f us  p99 %8.1f us  max %8.1f us\n", what, v.size(),
                quantile(v, 0.50), quantile(v, 0.99),
                v.empty() ? 0 : *std::max_element(v.begin(), v.end()));
}

// ---- latency -------------------------------------------------------------------------------

// CPU time a thread of this process has used (ns), from /proc/self/task/<tid>/schedstat.
uint64_t thread_cpu_ns(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/schedstat");
    uint64_t run = 0;
    in >> run;
    return run;
}

// Minor page faults a thread of this process has taken, from /proc/self/task/<tid>/stat.
uint64_t thread_minflt(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto p = s.rfind(')');
    if (p == std::string::npos) return 0;
    std::istringstream f(s.substr(p + 2));
    std::string field;
    for (int i = 3; i <= 10 && f >> field; ++i) {  // field 10: minflt
    }
    return std::strtoull(field.c_str(), nullptr, 10);
}

struct Round {
    std::string name;
    std::vector<double> total, agent, delivery, subflow_total;
    lua::EventThreadStats stats;
    double cpu_pct = 0;   // of one CPU, over the round
    uint64_t minflt = 0;  // the event thread's minor page faults over the round
};

// pairs > 0: only the default mode's in-thread / process pairs and their ratios.
void latency(int n, int pairs = 0) {
    datapath::init_libbpf_logging();
    LabConfig cfg;
    cfg.tag = "lb" + std::to_string(getpid() % 10000);
    Lab lab(cfg);
    Steering steer(server_chains(lab, 0), lab.server_ns(), Steering::pin_root_for("luabench"));
    lua::FlowIds ids;
    lua::StepWriteQueue step_writes;
    TimedBackend backend(steer.state(), ids, step_writes);
    lua::HookSet hooks(backend);
    lua::HookDispatcher dispatcher(ids);
    const std::vector<lua::ScriptSpec> specs = {
        {"bench", "lua/bench.lua",
         "function on_connection(c) return {rate = " + std::to_string(kConnectionRate) +
             "} end\n"
             "function on_subflow(sf) return {rate = " +
             std::to_string(kSubflowRate) + "} end\n",
         0, json::object()}};
    const char* spin_env = getenv("LUA_BENCH_SPIN_US");
    const auto spin = std::chrono::microseconds(spin_env ? std::atoi(spin_env) : 1000);
    const char* cpu_env = getenv("LUA_BENCH_CPU");
    const int pin_cpu = cpu_env && *cpu_env ? std::atoi(cpu_env) : -1;

    // One round of n connections with the agent's event thread (lua::EventThread, as `mpsteer
    // run --events=MODE [--events-rt-priority 10]` runs it), and a thread taking the events it
    // hands over, as the agent's main loop does.
    int port0 = 6000;
    // `process`: the scripts in the hook process (the agent's way); else in this process (a
    // HookSet on the event thread, as before the hook process existed).
    auto round = [&](lua::PollMode mode, int rt, int cpu, bool process) {
        Round r;
        r.name =
            std::string(process ? "process " : "in-thread ") + lua::to_string(mode) +
            (mode == lua::PollMode::adaptive ? " " + std::to_string(spin.count()) + " us" : "") +
            (cpu >= 0 ? ", CPU " + std::to_string(cpu) : "") +
            (rt ? ", SCHED_FIFO " + std::to_string(rt) : ", SCHED_OTHER");
        backend.total_us.clear();
        backend.agent_us.clear();
        backend.delivery_us.clear();
        backend.subflow_total_us.clear();
        lua::EventThreadOptions o;
        o.mode = mode;
        o.spin = spin;
        o.rt_priority = rt;
        o.cpu = cpu;
        o.before_hooks = [&](const datapath::Event& ev) {
            backend.handler_start_ns = mono_ns();
            backend.event_ns = ev.raw.ts_ns;
            backend.delivery_us.push_back((backend.handler_start_ns - ev.raw.ts_ns) / 1e3);
        };
        std::unique_ptr<lua::HookProcess> hook_process;
        if (process) {
            lua::HookProcessOptions ho;
            ho.executable = mpsteer_bin();
            ho.rt_priority = rt;  // as the agent does with --events-rt-priority
            hook_process = std::make_unique<lua::HookProcess>(backend, ho);
        }
        lua::Hooks& hk = process ? static_cast<lua::Hooks&>(*hook_process) : hooks;
        std::unique_ptr<lua::EventThread> et;
        {
            NetnsGuard in(lab.server_ns());  // the thread inherits it (sock_diag, ifindexes)
            et = std::make_unique<lua::EventThread>(steer.state(), dispatcher, hk, o);
        }
        et->call([&] { hk.configure(specs, "bench", 1); });
        std::atomic<bool> stop{false};
        std::thread owner([&] {
            pollfd p{et->notify_fd(), POLLIN, 0};
            while (!stop) {
                if (::poll(&p, 1, 50) > 0) et->take_events();
            }
        });
        const pid_t tid = et->tid();
        const uint64_t cpu0 = thread_cpu_ns(tid);
        const uint64_t flt0 = thread_minflt(tid);
        const auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) {
            uint16_t port = uint16_t(port0 + i % 1000);
            try {
                Sink sink(lab.server_ns(), port);
                send_stream(lab.client_ns(), Lab::server_addr(1), port,
                            SendOptions::of_bytes(20000));
                sink.wait(10s);
            } catch (const std::exception& e) {
                std::printf("  (connection %d: %s)\n", i, e.what());
            }
        }
        std::this_thread::sleep_for(300ms);
        const double wall_ns = double(std::chrono::nanoseconds(Clock::now() - t0).count());
        r.cpu_pct = 100.0 * double(thread_cpu_ns(tid) - cpu0) / wall_ns;
        r.minflt = thread_minflt(tid) - flt0;
        r.stats = et->stats();
        et->stop();
        stop = true;
        owner.join();
        et.reset();
        r.total = backend.total_us;
        r.agent = backend.agent_us;
        r.delivery = backend.delivery_us;
        r.subflow_total = backend.subflow_total_us;
        port0 += 1000;
        return r;
    };
    if (pairs > 0) {
        std::printf(
            "ratio: --events=wait, SCHED_OTHER, %d connections per round, %d alternating pairs "
            "(event thread, then hook process); p50 of event -> map updated\n",
            n, pairs);
        std::vector<double> ratios, thread_p50, process_p50;
        for (int i = 0; i < pairs; ++i) {
            const Round t = round(lua::PollMode::wait, 0, -1, false);
            const Round p = round(lua::PollMode::wait, 0, -1, true);
            const double a = quantile(t.total, 0.5), b = quantile(p.total, 0.5);
            thread_p50.push_back(a);
            process_p50.push_back(b);
            ratios.push_back(b / a);
            // on_subflow's event comes while on_connection's is in hand: it waits for it.
            std::printf(
                "  pair %2d: in-thread %7.1f us, process %7.1f us, ratio %.2f (on_subflow "
                "alone: %.1f / %.1f us)\n",
                i + 1, a, b, b / a, quantile(t.subflow_total, 0.5), quantile(p.subflow_total, 0.5));
        }
        const double median = quantile(ratios, 0.5);
        std::printf(
            " median p50: in-thread %.1f us, process %.1f us; ratio median %.2f [%.2f-%.2f] "
            "(target <= 2.00: %s)\n",
            quantile(thread_p50, 0.5), quantile(process_p50, 0.5), median,
            *std::min_element(ratios.begin(), ratios.end()),
            *std::max_element(ratios.begin(), ratios.end()), median <= 2.0 ? "met" : "NOT met");
        return;
    }
    // In-thread and process rounds alternate, so the two are measured side by side.
    std::vector<Round> rounds;
    for (int rt : {0, 10})
        for (auto mode : {lua::PollMode::wait, lua::PollMode::adaptive, lua::PollMode::spin})
            for (bool process : {false, true}) rounds.push_back(round(mode, rt, -1, process));
    if (pin_cpu >= 0)
        for (int rt : {0, 10})
            for (bool process : {false, true})
                rounds.push_back(round(lua::PollMode::spin, rt, pin_cpu, process));

    // The kernel's own path for a comparable action, same run, while a connection uses the
    // endpoint (so the kernel sends MP_PRIO on it).
    std::vector<double> nl_us, ip_us;
    {
        Sink sink(lab.server_ns(), 7999);
        std::atomic<bool> stop_tx{false};
        std::thread tx([&] {
            send_stream(lab.client_ns(), Lab::server_addr(1), 7999,
                        SendOptions::of_time(60s, &stop_tx));
        });
        std::this_thread::sleep_for(500ms);
        {
            NetnsGuard in(lab.server_ns());
            Genl g;
            for (int i = 0; i < n; ++i) {
                auto t0 = Clock::now();
                int rc = g.set_backup(1, i % 2 == 0);
                double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
                if (rc != 0) {
                    std::printf("  netlink SET_FLAGS failed: %s\n", std::strerror(-rc));
                    break;
                }
                nl_us.push_back(us);
            }
            g.set_backup(1, false);
        }
        for (int i = 0; i < 20; ++i) {
            auto t0 = Clock::now();
            run_in(lab.server_ns(),
                   {"ip", "mptcp", "endpoint", "change", "id", "1", i % 2 ? "nobackup" : "backup"});
            ip_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        run_in(lab.server_ns(), {"ip", "mptcp", "endpoint", "change", "id", "1", "nobackup"});
        stop_tx = true;
        tx.join();
        try {
            sink.wait(10s);
        } catch (const std::exception& e) {
            std::printf("  (netlink rows' background transfer: %s)\n", e.what());
        }
    }
    std::vector<double> write_us;  // the map write alone: one MPS_CTL_RATE request
    {
        auto flows = steer.flows();
        for (int i = 0; i < 2000 && !flows.empty(); ++i) {
            mps_ctl_flow_req req{};
            req.key = flows.front().first;
            req.set = MPS_CTL_RATE;
            req.rate_bps = 1000000 + i;
            uint64_t t0 = mono_ns();
            steer.state().update_flow(req);
            write_us.push_back((mono_ns() - t0) / 1e3);
        }
    }

    std::printf(
        "latency: %d connections per round (MP_CAPABLE keys -> on_connection once per "
        "connection, MP_JOIN -> on_subflow; each returns a rate written with "
        "MPS_CTL_RATE), the agent's event thread (lua::EventThread) in each mode\n",
        n);
    for (const auto& r : rounds) {
        const auto& st = r.stats;
        std::printf(
            " --events=%s: event thread CPU %.1f %% of one core; %llu events, %llu found "
            "polling, %llu wake-ups, %llu minor page faults%s\n",
            r.name.c_str(), r.cpu_pct, (unsigned long long)st.events,
            (unsigned long long)st.events_while_polling, (unsigned long long)st.wakeups,
            (unsigned long long)r.minflt, st.rt_refused ? " (SCHED_FIFO refused)" : "");
        print_row("mpsteer event (bpf_ktime) -> Lua hook -> map updated", r.total);
        print_row("  event -> handler start (wake-up/poll + token derivation)", r.delivery);
        print_row("  handler start -> Lua -> map updated", r.agent);
        std::printf("  %-58s n=%4llu  p50 %8.1f us  p99 %8.1f us (histogram)\n",
                    "  event -> hooks done, events found after a wake-up",
                    (unsigned long long)st.latency_after_wakeup.count(),
                    st.latency_after_wakeup.percentile_us(50),
                    st.latency_after_wakeup.percentile_us(99));
    }
    std::printf(" the kernel's path for the same kind of action, and the map write alone:\n");
    print_row("kernel netlink MPTCP_PM_CMD_SET_FLAGS backup (request -> ack)", nl_us);
    print_row("`ip mptcp endpoint change id 1 backup` (fork+exec+netlink)", ip_us);
    print_row("map write alone (ctl_flow_update, BPF_PROG_TEST_RUN)", write_us);
    std::printf(" summary (target: event -> map update p99 <= 50 us):\n");
    std::printf("  %-34s %9s %9s %9s %9s %7s  %s\n", "mode", "p50 us", "p99 us", "hdl p50",
                "hdl p99", "CPU %", "target");
    for (const auto& r : rounds)
        std::printf("  %-34s %9.1f %9.1f %9.1f %9.1f %7.1f  %s\n", r.name.c_str(),
                    quantile(r.total, 0.50), quantile(r.total, 0.99), quantile(r.agent, 0.50),
                    quantile(r.agent, 0.99), r.cpu_pct,
                    r.total.empty()                 ? "no samples"
                    : quantile(r.total, 0.99) <= 50 ? "met"
                                                    : "NOT met");
    std::printf("  %-34s %9.1f %9.1f\n", "kernel netlink SET_FLAGS", quantile(nl_us, 0.50),
                quantile(nl_us, 0.99));
}

// ---- small-flow completion time ------------------------------------------------------------

// One upload of `bytes`; seconds from the start of the connect to the sink's last byte, and
// the extra subflows the sender saw.
std::pair<double, unsigned> upload(const Lab& lab, uint16_t port, uint64_t bytes) {
    Sink sink(lab.server_ns(), port);
    auto t0 = Clock::now();
    TrafficStats sent =
        send_stream(lab.client_ns(), Lab::server_addr(1), port, SendOptions::of_bytes(bytes));
    TrafficStats got = sink.wait(120s);
    double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (got.bytes != bytes || got.checksum != sent.checksum)
        throw std::runtime_error("transfer incomplete or corrupted");
    return {sec, sent.subflows};
}

void summary(const char* what, const std::vector<double>& ms, unsigned joined) {
    double mean = 0;
    for (double v : ms) mean += v / double(ms.size());
    std::printf(
        "  %-34s n=%3zu  p50 %7.1f ms  p90 %7.1f ms  mean %7.1f ms  (%u with a 2nd subflow)\n",
        what, ms.size(), quantile(ms, 0.50), quantile(ms, 0.90), mean, joined);
}

void smallflow(int n) {
    datapath::init_libbpf_logging();
    LabConfig cfg;
    cfg.tag = "ls" + std::to_string(getpid() % 10000);
    cfg.path[0] = cfg.path[1] = PathShape{10, 50000};  // RTT 20 ms, 50 Mbit/s each
    Lab lab(cfg);
    std::vector<double> plain, policy;
    unsigned plain_j = 0, policy_j = 0;
    for (int i = 0; i < n; ++i) {
        auto [sec, sf] = upload(lab, uint16_t(5300 + i), 100000);
        plain.push_back(sec * 1e3);
        plain_j += sf > 0;
    }
    {
        AgentHarness agent(lab, "luasf", 10, /*client_side=*/true);
        agent.publish({{"policies/small-flow-pm.yaml", source("policies/small-flow-pm.yaml")},
                       {"lua/small_flow_pm.lua", source("lua/small_flow_pm.lua")}});
        agent.start();
        if (!agent.wait_status([](const json& s) { return s.value("ready", false); }, 90s, 20ms))
            throw std::runtime_error("agent not ready: " + agent.log_tail());
        for (int i = 0; i < n; ++i) {
            auto [sec, sf] = upload(lab, uint16_t(5400 + i), 100000);
            policy.push_back(sec * 1e3);
            policy_j += sf > 0;
        }
    }
    std::printf(
        "small-flow completion time: 100 KB uploads, two paths RTT 20 ms, 50 Mbit/s each\n");
    summary("kernel default (ADD_ADDR honoured)", plain, plain_j);
    summary("small-flow policy (agent, shipped policy)", policy, policy_j);
}

// ---- ECF vs the default scheduler ---------------------------------------------------------

void ecf(int runs) {
    datapath::init_libbpf_logging();
    const char* mb_env = getenv("LUA_BENCH_ECF_MB");
    const uint64_t bytes = uint64_t(mb_env ? std::atoi(mb_env) : 100) * 1'000'000;
    LabConfig cfg;
    cfg.tag = "le" + std::to_string(getpid() % 10000);
    cfg.path[0] = PathShape{10, 50000};  // RTT 20 ms (10 ms each way), 50 Mbit/s
    cfg.path[1] = PathShape{25, 50000};  // RTT 50 ms
    Lab lab(cfg);
    auto series = [&](const char* what, int port0) {
        std::vector<double> mbit;
        for (int r = 0; r < runs; ++r) {
            auto [sec, sf] = upload(lab, uint16_t(port0 + r), bytes);
            mbit.push_back(double(bytes) * 8 / sec / 1e6);
            std::printf("  %-26s run %d: %6.1f Mbit/s (%.1f s, %u extra subflows)\n", what, r + 1,
                        mbit.back(), sec, sf);
            std::fflush(stdout);
        }
        double mean = 0;
        for (double v : mbit) mean += v / double(mbit.size());
        return std::make_pair(mean, mbit);
    };
    std::printf(
        "ECF vs default: %llu MB uploads, paths RTT 20 ms / 50 ms, 50 Mbit/s each, %d runs\n",
        static_cast<unsigned long long>(bytes / 1'000'000), runs);
    auto def = series("kernel default scheduler", 5600);
    std::pair<double, std::vector<double>> with;
    {
        AgentHarness agent(lab, "luaecf", 10, /*client_side=*/true);
        // The scheduler policy names the slow path's interface: here path 2's.
        std::string policy = source("policies/ecf-scheduler.yaml");
        for (auto at = policy.find("wwan0"); at != std::string::npos; at = policy.find("wwan0"))
            policy.replace(at, 5, lab.client_if(2));
        agent.publish(
            {{"policies/ecf-scheduler.yaml", policy}, {"lua/ecf.lua", source("lua/ecf.lua")}});
        agent.start();
        if (!agent.wait_status([](const json& s) { return s.value("ready", false); }, 90s, 20ms))
            throw std::runtime_error("agent not ready: " + agent.log_tail());
        with = series("ECF script (backup flag)", 5700);
        json s = agent.status();
        for (const auto& h : s.value("lua_hooks", json::array()))
            std::printf("  ECF hook: %s, %s calls, %s failures, %s writes\n",
                        h.value("state", "").c_str(), h["calls"].dump().c_str(),
                        h["failures"].dump().c_str(), h["writes"].dump().c_str());
    }
    std::printf("  mean: default %.1f Mbit/s, ECF %.1f Mbit/s\n", def.first, with.first);
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode = argc > 1 ? argv[1] : "all";
    int arg = argc > 2 ? std::atoi(argv[2]) : 0;
    if (mode != "all" && mode != "latency" && mode != "ratio" && mode != "smallflow" &&
        mode != "ecf") {
        std::fprintf(stderr, "usage: lua_bench [latency|ratio|smallflow|ecf] [N]\n");
        return 2;
    }
    try {
        if (mode == "latency" || mode == "all") latency(arg > 0 ? arg : 200);
        if (mode == "ratio") latency(100, arg > 0 ? arg : 15);
        if (mode == "smallflow" || mode == "all") smallflow(arg > 0 ? arg : 20);
        if (mode == "ecf" || mode == "all") ecf(arg > 0 ? arg : 5);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "lua_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
