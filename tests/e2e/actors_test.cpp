// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The option-rewriting actors against the real kernel in network namespaces: what the MPTCP
// stack does when blk_subflow, add_subflow, set_backup, no_subflows, redirect and a drop
// guard rewrite its packets, and tshark's verdict on the rewritten packets (no malformed
// option, no bad checksum; every veth has tx checksumming off).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/mptcp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <thread>

#include "actors_topology.h"
#include "datapath/actors.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace std::chrono_literals;
using datapath::ChainSet;
using datapath::Hook;
using datapath::make_step;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint16_t kPort = 5201;

// Every case runs under both offload modes (lab.h): host (partial checksums and GSO
// super-packets at TC egress, GRO aggregates at TC ingress) and strict (the receiving stacks
// verify every checksum an actor wrote). Paths capped at 20 Mbit/s: the captures stay small
// enough for tshark to read in seconds.
#define EACH_OFFLOAD_MODE()                                           \
    const Offloads mode = GENERATE(Offloads::host, Offloads::strict); \
    INFO("offloads: " << to_string(mode))

LabConfig config(const char* what, Offloads mode) {
    LabConfig cfg;
    cfg.tag = std::string("ac") + what + std::to_string(getpid() % 10000);
    cfg.path[0] = cfg.path[1] = PathShape{0, 20000};
    cfg.offloads = mode;
    return cfg;
}

// No segment any of these stacks received had a bad TCP checksum (they verify them all in
// the strict mode).
void expect_no_checksum_errors(const std::vector<std::string>& namespaces) {
    for (const auto& ns : namespaces) {
        INFO(ns);
        CHECK(tcp_counters(ns).at("InCsumErrors") == 0);
    }
}

// The MPTCP counters of `netns` that moved since `before`, "Name +n" each: what the stack
// did with a subflow that went missing.
std::string mptcp_counters_moved(const std::string& netns,
                                 const std::map<std::string, uint64_t>& before) {
    std::string out = netns + ":";
    for (const auto& [name, v] : mptcp_counters(netns)) {
        auto it = before.find(name);
        uint64_t was = it == before.end() ? 0 : it->second;
        if (v != was) out += " " + name + " +" + std::to_string(v - was);
    }
    return out;
}

mps_step cidr_step(mps_word base, const std::string& addr, uint16_t on_match, uint16_t on_miss) {
    uint32_t a[4] = {};
    inet_pton(AF_INET, addr.c_str(), &a[0]);
    return datapath::Match(4).prefix(base, a, 32).step(on_match, on_miss);
}

mps_step kinds_step(uint32_t any_of, uint16_t on_match, uint16_t on_miss) {
    return datapath::kinds_match(any_of).step(on_match, on_miss);
}

mps_step backup_step(bool b) {
    mps_step s = make_step(MPS_ACT_SET_BACKUP, MPS_PC_END);
    s.p.backup.backup = b;
    return s;
}

// An upload from the client to the server's path-1 address in a thread, for `duration`.
class Upload {
public:
    Upload(const Lab& lab, std::chrono::milliseconds duration,
           const std::string& addr = Lab::server_addr(1))
        : sink_(lab.server_ns(), kPort) {
        thread_ = std::thread([this, &lab, duration, addr] {
            try {
                sent_ = send_stream(lab.client_ns(), addr, kPort,
                                    SendOptions::of_time(duration, &stop_));
            } catch (const std::exception& e) {
                error_ = e.what();
            }
        });
    }
    ~Upload() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
    }
    // Waits for the end; returns what the sender saw (and checks the sink got it all).
    TrafficStats finish() {
        thread_.join();
        if (!error_.empty()) FAIL(error_);
        TrafficStats got = sink_.wait(30s);
        CHECK(got.bytes == sent_.bytes);
        CHECK(got.checksum == sent_.checksum);
        return sent_;
    }

private:
    Sink sink_;
    std::atomic<bool> stop_{false};
    TrafficStats sent_;
    std::string error_;
    std::thread thread_;
};

// Bytes the client's kernel got acknowledged per subflow, by remote or local address prefix.
uint64_t acked(const std::string& netns, const std::string& local_prefix,
               const std::string& remote_prefix = "") {
    uint64_t n = 0;
    for (const auto& s : e2e::subflow_states(netns))
        if (s.local.rfind(local_prefix, 0) == 0 && s.remote.rfind(remote_prefix, 0) == 0)
            n += s.bytes_acked;
    return n;
}

// Waits for a netlink MPTCP event matching `pred`; returns when it came (or nullopt).
template <typename Pred>
std::optional<Clock::time_point> wait_event(MptcpMonitor& mon, std::chrono::milliseconds timeout,
                                            Pred pred) {
    auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
        for (const auto& e : mon.poll(20ms))
            if (pred(e)) return Clock::now();
    }
    return std::nullopt;
}

void check_capture(e2e::Capture& cap, Offloads mode, const std::string& rewritten_filter,
                   int at_least) {
    std::string p = cap.problems(mode == Offloads::strict);
    INFO("tshark: malformed or bad checksum:\n" << p);
    CHECK(p.empty());
    int n = cap.count(rewritten_filter);
    INFO("rewritten packets (" << rewritten_filter << "): " << n);
    CHECK(n >= at_least);
}

}  // namespace

TEST_CASE("actors: blk_subflow hides ADD_ADDR, the client keeps MPTCP on one subflow",
          "[e2e][actors][blk_subflow]") {
    datapath::init_libbpf_logging();
    EACH_OFFLOAD_MODE();
    Lab lab(config("b", mode));
    must_in(lab.server_ns(), {"sysctl", "-q", "-w", "net.mptcp.add_addr_timeout=1"});
    ChainSet cs;
    cs.steps = {make_step(MPS_ACT_BLK_SUBFLOW, MPS_PC_END)};
    cs.policies = {"hide-announcements"};
    cs.entries = {{Hook::xdp, "", 0}};
    cs.attachments = {{lab.client_if(1), Hook::xdp}, {lab.client_if(2), Hook::xdp}};
    Steering steer(cs, lab.client_ns(), Steering::pin_root_for("actors"));
    auto maps = datapath::ActorMaps::of(steer.generation());
    e2e::Capture cap(lab.client_ns(), lab.client_if(1));
    MptcpMonitor mon(lab.client_ns());

    Upload up(lab, 3s);
    TrafficStats sent = up.finish();
    CHECK_FALSE(sent.fallback);
    CHECK(sent.token != 0);
    CHECK(sent.subflows == 0);
    std::vector<MptcpEvent> evs = mon.poll(100ms);
    CHECK(std::none_of(evs.begin(), evs.end(), [](const MptcpEvent& e) {
        return e.type == MPTCP_EVENT_SUB_ESTABLISHED || e.type == MPTCP_EVENT_ANNOUNCED;
    }));
    auto anns = maps.announcements();
    REQUIRE(anns.size() == 1);
    CHECK(anns[0].address() == Lab::server_addr(2));
    CHECK(anns[0].value.state == MPS_ANN_BLOCKED);
    CHECK(anns[0].value.hidden >= 2);  // the first copy and at least one retransmission
    std::printf("blk_subflow: %u copies hidden, connection MPTCP, %u extra subflows\n",
                anns[0].value.hidden, sent.subflows);
    check_capture(cap, mode, "tcp.options.mptcp.subtype == 3 && tcp.options.mptcp.echo == 0",
                  int(anns[0].value.hidden));
    expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
}

TEST_CASE("actors: add_subflow delivers a hidden announcement after its retransmissions ended",
          "[e2e][actors][add_subflow]") {
    datapath::init_libbpf_logging();
    EACH_OFFLOAD_MODE();
    Lab lab(config("a", mode));
    must_in(lab.server_ns(), {"sysctl", "-q", "-w", "net.mptcp.add_addr_timeout=1"});
    ChainSet cs;
    cs.steps = {make_step(MPS_ACT_BLK_SUBFLOW, MPS_PC_END),
                make_step(MPS_ACT_ADD_SUBFLOW, MPS_PC_END)};
    cs.policies = {"hide-then-add"};
    cs.entries = {{Hook::xdp, "", 0}, {Hook::tc_ingress, "", 1}};
    for (int p = 1; p <= 2; p++)
        for (Hook h : {Hook::xdp, Hook::tc_ingress})
            cs.attachments.push_back({lab.client_if(p), h});
    Steering steer(cs, lab.client_ns(), Steering::pin_root_for("actors"));
    auto maps = datapath::ActorMaps::of(steer.generation());
    e2e::Capture cap(lab.client_ns(), lab.client_if(1));
    MptcpMonitor mon(lab.client_ns());

    Upload up(lab, 12s);
    // The server retransmits an unechoed ADD_ADDR a few times, add_addr_timeout apart; wait
    // until it has given up (no copy for 2.5 s).
    std::optional<datapath::Announcement> ann;
    auto give_up = Clock::now() + 9s;
    uint64_t last_hidden = 0;
    auto quiet_since = Clock::now();
    while (Clock::now() < give_up) {
        std::this_thread::sleep_for(100ms);
        auto all = maps.announcements();
        if (all.empty()) continue;
        if (all[0].value.hidden != last_hidden) {
            last_hidden = all[0].value.hidden;
            quiet_since = Clock::now();
        }
        if (last_hidden >= 2 && Clock::now() - quiet_since > 2500ms) {
            ann = all[0];
            break;
        }
    }
    REQUIRE(ann);
    mon.poll(0ms);
    std::printf("add_subflow: %u copies hidden, retransmissions over; requesting\n",
                ann->value.hidden);
    auto t0 = Clock::now();
    REQUIRE(maps.request_add_subflow(ann->key));
    auto joined = wait_event(mon, 2s, [](const MptcpEvent& e) {
        return e.type == MPTCP_EVENT_SUB_ESTABLISHED && e.daddr == Lab::server_addr(2);
    });
    REQUIRE(joined);
    double ms = std::chrono::duration<double, std::milli>(*joined - t0).count();
    std::printf("add_subflow: subflow to %s established %.1f ms after the request\n",
                Lab::server_addr(2).c_str(), ms);
    CHECK(ms < 1000);
    CHECK(maps.find(ann->key)->value.state == MPS_ANN_RELEASED);
    // Data flows on it.
    uint64_t before = acked(lab.client_ns(), Lab::client_addr(2));
    std::this_thread::sleep_for(1500ms);
    uint64_t after = acked(lab.client_ns(), Lab::client_addr(2));
    std::printf("add_subflow: %llu bytes acked on the new subflow in 1.5 s\n",
                (unsigned long long)(after - before));
    CHECK(after - before > 100000);
    TrafficStats sent = up.finish();
    CHECK_FALSE(sent.fallback);
    // The hidden copies and the carrier, as the client's stack received them.
    check_capture(cap, mode, "tcp.options.mptcp.subtype == 3 && tcp.options.mptcp.echo == 0",
                  int(ann->value.hidden) + 1);
    expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
}

namespace {
// set_backup on the server's ACKs towards the client's path-2 address; then, when `restore`,
// B=0 in place. Once the client has moved its data off that subflow it is idle in both
// directions and the server sends no pure ACK on it that could carry B=0: the agent's part,
// ActorMaps::signal_prio, sends the pure ACK that follows the last one the actor saw on it
// (AF_PACKET on the server's interface, through the tc egress hook), with MP_PRIO B=0.
void set_backup_scenario(bool restore, Offloads mode) {
    datapath::init_libbpf_logging();
    LabConfig cfg = config("p", mode);
    // (equal paths: without backup the client splits its data about evenly)
    Lab lab(cfg);
    ChainSet cs;
    // Server TC egress: its ACKs on path 2 carry MP_PRIO (one-shot).
    cs.steps = {cidr_step(MPS_W_DST, Lab::client_addr(2), 1, MPS_PC_END), backup_step(true)};
    cs.policies = {"path2-backup"};
    cs.entries = {{Hook::tc_egress, "", 0}};
    cs.attachments = {{lab.server_if(1), Hook::tc_egress}, {lab.server_if(2), Hook::tc_egress}};
    Steering steer(cs, lab.server_ns(), Steering::pin_root_for("actors"));
    e2e::Capture cap(lab.client_ns(), lab.client_if(2));
    MptcpMonitor mon(lab.client_ns());
    auto prio = [](const MptcpEvent& e) {
        return e.type == MPTCP_EVENT_SUB_PRIORITY && e.saddr == Lab::client_addr(2);
    };
    auto share2 = [&](std::chrono::milliseconds over) {
        uint64_t a1 = acked(lab.client_ns(), Lab::client_addr(1));
        uint64_t a2 = acked(lab.client_ns(), Lab::client_addr(2));
        std::this_thread::sleep_for(over);
        uint64_t d1 = acked(lab.client_ns(), Lab::client_addr(1)) - a1;
        uint64_t d2 = acked(lab.client_ns(), Lab::client_addr(2)) - a2;
        return d1 + d2 ? double(d2) / double(d1 + d2) : 0.0;
    };
    auto flags2 = [&] {
        for (const auto& s : e2e::subflow_states(lab.client_ns()))
            if (s.local.rfind(Lab::client_addr(2) + ":", 0) == 0) return s.flags;
        return std::string("?");
    };

    Upload up(lab, 9s);
    REQUIRE(wait_event(mon, 3s, prio));
    std::this_thread::sleep_for(300ms);
    double backup_share = share2(2s);
    std::string f_backup = flags2();
    std::printf("set_backup B=1: path-2 share %.2f %%, subflow flags %s\n", 100 * backup_share,
                f_backup.c_str());
    CHECK(backup_share < 0.05);
    CHECK(f_backup.find('B') != std::string::npos);
    if (!restore) {
        TrafficStats sent = up.finish();
        CHECK_FALSE(sent.fallback);
        check_capture(cap, mode, "tcp.options.mptcp.subtype == 5", 1);
        expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
        return;
    }

    // B=0 in place, as the agent would: the step, then the signal on idle subflows.
    mps_step b0 = backup_step(false);
    uint32_t pc = 1;
    auto maps = datapath::ActorMaps::of(steer.generation());
    mon.poll(0ms);
    auto t0 = Clock::now();
    steer.generation().write_step(pc, b0);
    int signalled = 0;
    {
        NetnsGuard in(lab.server_ns());
        signalled = maps.signal_prio(1, false, 200'000'000);  // quiet for 200 ms: idle
    }
    std::printf("set_backup B=0: %d MP_PRIO sent from templates\n", signalled);
    CHECK(signalled == 1);  // path 2, server to client (the client sends nothing there)
    auto restored_at = wait_event(mon, 3s, prio);
    REQUIRE(restored_at);
    std::printf("set_backup B=0: SUB_PRIORITY on the client %.1f ms after the step update\n",
                std::chrono::duration<double, std::milli>(*restored_at - t0).count());
    std::this_thread::sleep_for(300ms);
    double restored = share2(2s);
    std::string f_restored = flags2();
    std::printf("set_backup B=0: path-2 share %.2f %%, subflow flags %s\n", 100 * restored,
                f_restored.c_str());
    CHECK(restored > 0.2);
    CHECK(f_restored.find('B') == std::string::npos);
    TrafficStats sent = up.finish();
    CHECK_FALSE(sent.fallback);
    check_capture(cap, mode, "tcp.options.mptcp.subtype == 5", 2);
    // The B=0 signal as the client received it: a valid pure ACK on path 2 with MP_PRIO B=0.
    check_capture(cap, mode,
                  "tcp.options.mptcp.subtype == 5 && tcp.options.mptcp.backup.flag == 0 && "
                  "ip.dst == " +
                      Lab::client_addr(2) + " && tcp.len == 0",
                  1);
    expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
}
}  // namespace

TEST_CASE("actors: set_backup B=1 moves the client's data off a subflow",
          "[e2e][actors][set_backup]") {
    EACH_OFFLOAD_MODE();
    set_backup_scenario(false, mode);
}

TEST_CASE("actors: set_backup B=0 brings the data back", "[e2e][actors][set_backup]") {
    EACH_OFFLOAD_MODE();
    set_backup_scenario(true, mode);
}

TEST_CASE("actors: the MP_CAPABLE C flag keeps the client off the load-balanced address",
          "[e2e][actors][no_subflows]") {
    datapath::init_libbpf_logging();
    EACH_OFFLOAD_MODE();
    Lab lab(config("c", mode));
    // The client would open a subflow from 10.0.2.1 to the server's initial (load-balanced)
    // address 10.0.1.2; the server announces its unique address 10.0.2.2.
    must({"ip", "-n", lab.client_ns(), "mptcp", "endpoint", "add", Lab::client_addr(2), "dev",
          lab.client_if(2), "subflow"});
    ChainSet cs;
    // Server TC egress: C on the SYN/ACK; the subflow through the load-balanced address
    // becomes backup.
    cs.steps = {make_step(MPS_ACT_NO_SUBFLOWS, 1),
                cidr_step(MPS_W_SRC, Lab::server_addr(1), 2, MPS_PC_END), backup_step(true)};
    cs.policies = {"load-balancer"};
    cs.entries = {{Hook::tc_egress, "", 0}};
    cs.attachments = {{lab.server_if(1), Hook::tc_egress}, {lab.server_if(2), Hook::tc_egress}};
    Steering steer(cs, lab.server_ns(), Steering::pin_root_for("actors"));
    e2e::Capture cap(lab.client_ns(), lab.client_if(1));

    Upload up(lab, 4s);
    std::this_thread::sleep_for(1500ms);
    uint64_t lb0 = acked(lab.client_ns(), "", Lab::server_addr(1) + ":");
    uint64_t un0 = acked(lab.client_ns(), "", Lab::server_addr(2) + ":");
    auto states = e2e::subflow_states(lab.client_ns());
    std::this_thread::sleep_for(1500ms);
    uint64_t lb = acked(lab.client_ns(), "", Lab::server_addr(1) + ":") - lb0;
    uint64_t un = acked(lab.client_ns(), "", Lab::server_addr(2) + ":") - un0;
    TrafficStats sent = up.finish();
    int to_lb = 0, to_unique = 0;
    for (const auto& s : states) {
        std::printf("no_subflows: subflow %s -> %s flags %s\n", s.local.c_str(), s.remote.c_str(),
                    s.flags.c_str());
        if (s.remote == Lab::server_addr(1) + ":" + std::to_string(kPort)) to_lb++;
        if (s.remote == Lab::server_addr(2) + ":" + std::to_string(kPort)) to_unique++;
    }
    CHECK_FALSE(sent.fallback);
    CHECK(to_lb == 1);      // the initial subflow only
    CHECK(to_unique == 1);  // the join to the announced unique address
    std::printf("no_subflows: %llu bytes via the unique address, %llu via the load balancer\n",
                (unsigned long long)un, (unsigned long long)lb);
    CHECK(un > 0);
    CHECK(double(un) / double(un + lb + 1) > 0.9);
    check_capture(cap, mode, "tcp.options.mptcp.nomoresubflows.flag == 1", 1);
    expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
}

TEST_CASE("actors: a drop guard refuses MP_CAPABLE SYNs to the unique address, joins pass",
          "[e2e][actors][guard]") {
    datapath::init_libbpf_logging();
    EACH_OFFLOAD_MODE();
    Lab lab(config("g", mode));
    ChainSet cs;
    // Server XDP: to the unique address, a SYN that is not an MP_JOIN is dropped.
    cs.steps = {cidr_step(MPS_W_DST, Lab::server_addr(2), 1, MPS_PC_END),
                kinds_step(MPS_K_SYN, 2, MPS_PC_END), kinds_step(MPS_K_MP_JOIN, MPS_PC_END, 3),
                make_step(MPS_ACT_DROP, MPS_PC_END)};
    cs.policies = {"unique-address-guard"};
    cs.entries = {{Hook::xdp, "", 0}};
    cs.attachments = {{lab.server_if(1), Hook::xdp}, {lab.server_if(2), Hook::xdp}};
    Steering steer(cs, lab.server_ns(), Steering::pin_root_for("actors"));
    e2e::Capture cap(lab.client_ns(), lab.client_if(2));
    MptcpMonitor mon(lab.client_ns());

    Sink sink(lab.server_ns(), kPort);
    auto t0 = Clock::now();
    bool connected = e2e::try_connect(lab.client_ns(), Lab::server_addr(2), kPort, 2500ms);
    std::printf("guard: MP_CAPABLE connect to %s %s after %.0f ms\n", Lab::server_addr(2).c_str(),
                connected ? "SUCCEEDED" : "failed",
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    CHECK_FALSE(connected);
    auto drops = steer.generation().step_counters()[3].drops;
    CHECK(drops >= 2);  // the SYN and its retransmission

    TrafficStats sent =
        send_stream(lab.client_ns(), Lab::server_addr(1), kPort, SendOptions::of_time(2s));
    TrafficStats got = sink.wait(30s);
    CHECK(got.bytes == sent.bytes);
    CHECK_FALSE(sent.fallback);
    CHECK(sent.subflows == 1);
    auto evs = mon.poll(100ms);
    CHECK(std::any_of(evs.begin(), evs.end(), [](const MptcpEvent& e) {
        return e.type == MPTCP_EVENT_SUB_ESTABLISHED && e.daddr == Lab::server_addr(2);
    }));
    // What left the client towards the unique address: MP_CAPABLE SYNs (dropped at the
    // server) and the MP_JOIN that went through.
    check_capture(cap, mode,
                  "tcp.flags.syn == 1 && tcp.flags.ack == 0 && tcp.options.mptcp.subtype == 1", 1);
    expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
}

TEST_CASE(
    "actors: reject answers a SYN with its reset, into this host's stack from tc_egress and "
    "to the sender from tc_ingress",
    "[e2e][actors][reject]") {
    datapath::init_libbpf_logging();
    EACH_OFFLOAD_MODE();
    Lab lab(config("j", mode));
    Sink sink(lab.server_ns(), kPort);  // a listener: without a policy the connect succeeds
    // SYNs to the server's path-2 address are refused, on one host's hook at a time.
    auto refusing = [&](Hook hook, const std::string& ifname) {
        ChainSet cs;
        cs.steps = {cidr_step(MPS_W_DST, Lab::server_addr(2), 1, MPS_PC_END),
                    kinds_step(MPS_K_SYN, 2, MPS_PC_END), make_step(MPS_ACT_REJECT, MPS_PC_END)};
        cs.policies = {"refuse"};
        cs.entries = {{hook, "", 0}};
        cs.attachments = {{ifname, hook}};
        return cs;
    };
    for (bool at_server : {true, false}) {
        INFO((at_server ? "server tc_ingress" : "client tc_egress"));
        const std::string ns = at_server ? lab.server_ns() : lab.client_ns();
        Steering steer(at_server ? refusing(Hook::tc_ingress, lab.server_if(2))
                                 : refusing(Hook::tc_egress, lab.client_if(2)),
                       ns, Steering::pin_root_for("actors"));
        e2e::Capture cap(lab.server_ns(), lab.server_if(2));
        // Refused at once: a dropped SYN would time out instead.
        CHECK(e2e::connect_error(lab.client_ns(), Lab::server_addr(2), kPort, 2500ms) ==
              ECONNREFUSED);
        // One SYN, never sent again; the reset is all the server's interface carries back
        // (from tc_ingress) or the SYN never reaches it (from the client's tc_egress).
        CHECK(steer.generation().step_counters()[2].runs == 1);
        CHECK(cap.problems(mode == Offloads::strict).empty());
        CHECK(cap.count("tcp.flags.syn == 1") == (at_server ? 1 : 0));
        CHECK(cap.count("tcp.flags.reset == 1 && tcp.flags.ack == 1 && tcp.seq_raw == 0") ==
              (at_server ? 1 : 0));
    }
    CHECK(e2e::connect_error(lab.client_ns(), Lab::server_addr(2), kPort, 2500ms) == 0);
    expect_no_checksum_errors({lab.client_ns(), lab.server_ns()});
}

TEST_CASE("actors: redirect spreads one client's subflows over the middle host's two uplinks",
          "[e2e][actors][redirect]") {
    datapath::init_libbpf_logging();
    EACH_OFFLOAD_MODE();
    e2e::MiddleTopology topo("ard" + std::to_string(getpid() % 10000), mode);
    const std::string mid = topo.ns("mid");
    ChainSet cs;
    // Middle host, TC egress of uplink 1: the subflow from the client's second address goes
    // out of uplink 2 instead.
    mps_step src = cidr_step(MPS_W_SRC, e2e::MiddleTopology::kClient2, 1, MPS_PC_END);
    cs.steps = {src, make_step(MPS_ACT_REDIRECT, MPS_PC_END)};
    cs.step_ifnames = {{1, topo.dev("u2")}};
    cs.policies = {"disjoint-uplinks"};
    cs.entries = {{Hook::tc_egress, "", 0}};
    cs.attachments = {{topo.dev("u1"), Hook::tc_egress}};
    Steering steer(cs, mid, Steering::pin_root_for("actors"));
    e2e::Capture cap(topo.ns("srv"), topo.dev("v2"));

    auto u1a = link_counters(mid, topo.dev("u1")), u2a = link_counters(mid, topo.dev("u2"));
    const auto cli_mib = mptcp_counters(topo.ns("cli")), srv_mib = mptcp_counters(topo.ns("srv"));
    MptcpMonitor mon(topo.ns("cli"));
    Sink sink(topo.ns("srv"), kPort);
    TrafficStats sent =
        send_stream(topo.ns("cli"), e2e::MiddleTopology::kService, kPort, SendOptions::of_time(3s));
    TrafficStats got = sink.wait(30s);
    auto u1b = link_counters(mid, topo.dev("u1")), u2b = link_counters(mid, topo.dev("u2"));
    uint64_t via1 = u1b.tx_bytes - u1a.tx_bytes, via2 = u2b.tx_bytes - u2a.tx_bytes;
    std::printf("redirect: %llu bytes out of uplink 1, %llu out of uplink 2 (sent %llu)\n",
                (unsigned long long)via1, (unsigned long long)via2, (unsigned long long)sent.bytes);
    CHECK(got.bytes == sent.bytes);
    CHECK(got.checksum == sent.checksum);
    CHECK_FALSE(sent.fallback);
    {
        // What happened to the joining subflow when it is not there at the end.
        std::string events;
        for (const auto& e : mon.poll(100ms)) events += "\n  " + to_string(e);
        INFO("client events:" << events);
        INFO(mptcp_counters_moved(topo.ns("cli"), cli_mib));
        INFO(mptcp_counters_moved(topo.ns("srv"), srv_mib));
        CHECK(sent.subflows == 1);
    }
    // The kernel's scheduler decides the split; each uplink must carry a real share.
    CHECK(via1 > 1000000);
    CHECK(via2 > 1000000);
    CHECK(via1 + via2 >= sent.bytes);
    CHECK(steer.generation().step_counters()[1].matched > 0);
    // Everything that left uplink 2 came from the client's second address.
    check_capture(cap, mode, "ip.src == 10.20.0.3", 1);
    CHECK(cap.count("ip.src == 10.20.0.1") == 0);
    expect_no_checksum_errors({topo.ns("cli"), topo.ns("mid"), topo.ns("srv")});
}
