// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The datapath on live MPTCP traffic between two namespaces: record, get_connect and
// get_subflow against the kernel's own view of the connection, and rate_limit against the
// kernel's per-subflow byte counters.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <linux/mptcp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include "compile/compile.h"
#include "lab/lab.h"
#include "net/address.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using namespace std::chrono_literals;
using datapath::Event;
using datapath::EventReader;

namespace {

LabConfig config(const char* what) {
    Lab::cleanup_stale();  // leftovers of a crashed run
    LabConfig cfg;
    cfg.tag = what + std::to_string(getpid() % 1000000);
    return cfg;
}

std::string hex(uint32_t v) {
    char b[12];
    std::snprintf(b, sizeof b, "%08x", v);
    return b;
}

// Sends from the client to the server's path-1 address for `duration` in a thread, polling
// the event ring meanwhile; `each` runs every poll with the seconds elapsed.
template <typename Each>
std::pair<TrafficStats, TrafficStats> transfer(const Lab& lab, std::chrono::milliseconds duration,
                                               EventReader& events, Each each) {
    Sink sink(lab.server_ns(), 5201);
    TrafficStats sent;
    std::string error;
    std::atomic<bool> done{false};
    std::thread sender([&] {
        try {
            sent = send_stream(lab.client_ns(), Lab::server_addr(1), 5201,
                               SendOptions::of_time(duration));
        } catch (const std::exception& e) {
            error = e.what();
        }
        done = true;
    });
    auto t0 = std::chrono::steady_clock::now();
    while (!done) {
        events.poll(20ms);
        each(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    sender.join();
    if (!error.empty()) FAIL(error);
    TrafficStats got = sink.wait(30s);
    events.poll(50ms);
    return {sent, got};
}

}  // namespace

TEST_CASE("datapath: record, get_connect, get_subflow see both subflows with the kernel's tokens",
          "[e2e][datapath]") {
    datapath::init_libbpf_logging();
    std::string pins;
    {
        Lab lab(config("a"));
        Steering steer(server_chains(lab, 0), lab.server_ns(), Steering::pin_root_for("e2e"));
        pins = steer.state().pin_root();
        for (const auto& l : steer.links())  // native XDP and TCX expected on this kernel
            CHECK((l->mode() == "xdp-native" || l->mode() == "tcx"));
        MptcpMonitor mon_srv(lab.server_ns()), mon_cli(lab.client_ns());
        std::vector<Event> evs;
        EventReader reader(steer.state(), [&](const Event& e) { evs.push_back(e); });

        auto [sent, got] = transfer(lab, 2s, reader, [](double) {});

        // The transfer itself: intact, MPTCP, two subflows.
        REQUIRE(sent.bytes > 0);
        CHECK(got.bytes == sent.bytes);
        CHECK(got.checksum == sent.checksum);
        REQUIRE_FALSE(sent.fallback);
        CHECK(sent.subflows == 1);  // one subflow besides the initial one
        const uint32_t cli_token = sent.token, srv_token = got.token;
        INFO("kernel tokens: client " << hex(cli_token) << ", server " << hex(srv_token));

        // What the kernel announced over netlink agrees with MPTCP_INFO.
        std::vector<MptcpEvent> ks, kc;
        for (auto& e : mon_srv.poll(200ms)) ks.push_back(e);
        for (auto& e : mon_cli.poll(0ms)) kc.push_back(e);
        auto has = [](const std::vector<MptcpEvent>& v, uint32_t type, uint32_t token,
                      const std::string& saddr) {
            return std::any_of(v.begin(), v.end(), [&](const MptcpEvent& e) {
                return e.type == type && e.token == token && e.saddr == saddr;
            });
        };
        CHECK(has(ks, MPTCP_EVENT_CREATED, srv_token, Lab::server_addr(1)));
        CHECK(has(ks, MPTCP_EVENT_SUB_ESTABLISHED, srv_token, Lab::server_addr(2)));
        CHECK(has(kc, MPTCP_EVENT_CREATED, cli_token, Lab::client_addr(1)));
        CHECK(has(kc, MPTCP_EVENT_SUB_ESTABLISHED, cli_token, Lab::client_addr(2)));

        // get_connect: MP_CAPABLE keys, all on path 1, hashing to the kernel's tokens.
        // (The flow key puts the lower address first: a = client, b = server.)
        int mpc = 0, mpc_both = 0, joins = 0;
        for (const auto& e : evs) {
            if (e.raw.type == MPS_EV_MP_CAPABLE) {
                mpc++;
                INFO("MP_CAPABLE " << datapath::to_string(e.raw.flow) << " tokens "
                                   << hex(e.token_a) << "/" << hex(e.token_b));
                CHECK(net::address_text(4, e.raw.flow.a) == Lab::client_addr(1));
                CHECK(e.raw.flow.port_b == 5201);
                if (e.token_a) CHECK(e.token_a == cli_token);
                if (e.token_b) CHECK(e.token_b == srv_token);
                if (e.token_a && e.token_b) mpc_both++;
            } else if (e.raw.type == MPS_EV_MP_JOIN) {
                joins++;
                INFO("MP_JOIN " << datapath::to_string(e.raw.flow) << " token "
                                << hex(e.raw.token));
                CHECK(net::address_text(4, e.raw.flow.a) == Lab::client_addr(2));
                CHECK(net::address_text(4, e.raw.flow.b) == Lab::server_addr(2));
                CHECK(e.raw.token == srv_token);  // the receiver's (server's) token
                CHECK(e.raw.from_a == 1);
            }
        }
        CHECK(mpc >= 1);
        CHECK(mpc_both >= 1);
        CHECK(joins == 1);

        // record: both subflows in the flow map, both directions counted, tokens filled in.
        int seen = 0;
        uint64_t upload = 0;
        for (const auto& [k, f] : steer.flows()) {
            if (k.port_b != 5201) continue;
            seen++;
            INFO("flow " << datapath::to_string(k) << " c->s " << f.dir_ab.packets << " pkts "
                         << f.dir_ab.bytes << " B, s->c " << f.dir_ba.packets << " pkts, srtt "
                         << f.srtt_us << " us, tokens " << hex(f.token[0]) << "/"
                         << hex(f.token[1]));
            const bool join = net::address_text(4, k.a) == Lab::client_addr(2);
            CHECK(f.role == (join ? MPS_ROLE_JOIN : MPS_ROLE_INITIAL));
            CHECK(f.dir_ab.packets > 0);
            CHECK(f.dir_ab.bytes > 0);
            CHECK(f.dir_ba.packets > 0);
            CHECK(f.srtt_us > 0);
            CHECK(f.token[0] == cli_token);
            CHECK(f.token[1] == srv_token);
            CHECK(f.conn_token == std::min(cli_token, srv_token));
            upload += f.dir_ab.bytes;
        }
        CHECK(seen == 2);
        // Every payload byte crossed one of the two XDP hooks (retransmissions add a little).
        CHECK(upload >= sent.bytes);
        CHECK(upload <= sent.bytes + sent.bytes / 20);
        auto conn = steer.conn(std::min(cli_token, srv_token));
        REQUIRE(conn);
        CHECK(conn->subflows == 2);
        CHECK(conn->bytes > 0);

        auto gc = steer.generation().gen_counters();
        CHECK(gc.values[MPS_GC_MISSED_TAIL_CALL] == 0);
        CHECK(gc.values[MPS_GC_EVENTS_LOST] == 0);
        CHECK(gc.values[MPS_GC_PACKETS] > 0);
    }
    CHECK_FALSE(std::filesystem::exists(pins));
}

namespace {

// 20 ms RTT on both paths so windows mean something (window = rate x RTT = 20 kB); both paths
// capped at 40 Mbit/s, five times the limit, which keeps the CPUs out of the way.
LabConfig rate_config(const char* what) {
    LabConfig cfg = config(what);
    cfg.path[0] = cfg.path[1] = PathShape{10, 40000};
    return cfg;
}

// A 7 s upload over both paths while `steer` caps path 2 at `rate` bytes/s: path 2's payload
// rate as the client's kernel counts it, within 15 %; path 1 (not limited) carries the rest.
void expect_path2_capped(const Lab& lab, Steering& steer, double rate_cap) {
    EventReader reader(steer.state(), [](const Event&) {});
    auto path2 = [&] {
        for (const auto& s : tcp_subflows(lab.client_ns()))
            if (s.local.rfind(Lab::client_addr(2) + ":", 0) == 0) return s.bytes_acked;
        return uint64_t{0};
    };
    const auto& srv = lab.server_ns();
    const std::string dev2 = lab.server_if(2), dev1 = lab.server_if(1);
    uint64_t acked0 = 0, acked1 = 0, wire0 = 0, wire1 = 0, p1_0 = 0, p1_1 = 0;
    double t0 = 0, t1 = 0;
    // Steady interval: from 2 s (handshakes, slow start and the first RTT samples are over)
    // to 6 s.
    auto [sent, got] = transfer(lab, 7s, reader, [&](double t) {
        if (!t0 && t >= 2.0) {
            t0 = t;
            acked0 = path2();
            wire0 = link_counters(srv, dev2).rx_bytes;
            p1_0 = link_counters(srv, dev1).rx_bytes;
        } else if (t0 && !t1 && t >= 6.0) {
            t1 = t;
            acked1 = path2();
            wire1 = link_counters(srv, dev2).rx_bytes;
            p1_1 = link_counters(srv, dev1).rx_bytes;
        }
    });
    REQUIRE(t1 > t0);
    CHECK(got.checksum == sent.checksum);
    REQUIRE_FALSE(sent.fallback);
    const double rate = (acked1 - acked0) / (t1 - t0);
    const double wire = (wire1 - wire0) / (t1 - t0);
    const double other = (p1_1 - p1_0) / (t1 - t0);
    // What the datapath knew, for the failure message.
    uint32_t srtt = 0;
    std::string diag;
    char line[256];
    for (const auto& [k, f] : steer.flows()) {
        if (k.port_b != 5201) continue;
        if (net::address_text(4, k.a) == Lab::client_addr(2)) srtt = f.srtt_us;
        std::snprintf(line, sizeof line, "flow %s: wscale %d/%d (known %d/%d), srtt %u us\n",
                      datapath::to_string(k).c_str(), f.dir_ab.wscale, f.dir_ba.wscale,
                      f.dir_ab.wscale_known, f.dir_ba.wscale_known, f.srtt_us);
        diag += line;
    }
    auto counters = steer.generation().step_counters();
    for (size_t i = 0; i < counters.size(); i++) {
        std::snprintf(line, sizeof line, "step %zu: runs %llu matched %llu\n", i,
                      static_cast<unsigned long long>(counters[i].runs),
                      static_cast<unsigned long long>(counters[i].matched));
        diag += line;
    }
    std::printf(
        "rate_limit: configured %.0f B/s, path 2 payload %.0f B/s (%+.1f %%), "
        "wire %.0f B/s, path 1 wire %.0f B/s, srtt %u us, windows lowered %llu\n",
        rate_cap, rate, 100 * (rate / rate_cap - 1), wire, other, srtt,
        static_cast<unsigned long long>(counters.back().matched));
    INFO(diag);
    INFO("path 2 payload rate " << rate << " B/s, wire " << wire << " B/s; path 1 " << other);
    CHECK(rate >= rate_cap * 0.85);
    CHECK(rate <= rate_cap * 1.15);
    CHECK(counters.back().matched > 0);  // the actor (the last step) lowered windows
    CHECK(other > 2 * rate_cap);
}

}  // namespace

TEST_CASE("datapath: rate_limit holds one subflow to its configured rate", "[e2e][datapath]") {
    datapath::init_libbpf_logging();
    constexpr double kRate = 1e6;  // bytes/s: 8 Mbit/s
    Lab lab(rate_config("b"));
    // record at XDP and TC egress measures the RTT the actor uses.
    Steering steer(server_chains(lab, static_cast<uint64_t>(kRate)), lab.server_ns(),
                   Steering::pin_root_for("e2e"));
    expect_path2_capped(lab, steer, kRate);
}

TEST_CASE("datapath: rate_limit alone at TC egress, compiled from a manifest, holds its rate",
          "[e2e][datapath]") {
    // The receiver lowers the windows of its own ACKs on path 2 and runs nothing else: the
    // compiler attaches the entry at TC ingress to learn the client's SYNs (window scale), and
    // the actor uses the manifest's RTT (no record measures one).
    datapath::init_libbpf_logging();
    constexpr double kRate = 1e6;
    Lab lab(rate_config("r"));
    manifest::Options o;
    o.known_interfaces = std::set<std::string>{lab.server_if(1), lab.server_if(2)};
    o.check_scripts = false;
    const std::string yaml =
        "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: limit}\n"
        "spec:\n  attach: {interfaces: [" +
        lab.server_if(2) +
        "], hooks: [tc_egress]}\n  priority: 10\n"
        "  select:\n    - dst: " +
        Lab::client_addr(2) +
        "/32\n"
        "  actions:\n    - rate_limit: {rate: 8Mbit, rtt: 20ms}\n";
    auto loaded = manifest::load_sources({{"limit.yaml", yaml}}, o);
    std::string diagnostics;
    for (const auto& d : loaded.diagnostics) diagnostics += d.format() + "\n";
    INFO(diagnostics);
    REQUIRE(loaded.ok());
    auto chains = compile::compile(loaded.model).chains;
    REQUIRE(chains.learning_hooks == std::vector<datapath::Hook>{datapath::Hook::tc_ingress});
    Steering steer(chains, lab.server_ns(), Steering::pin_root_for("e2e"));
    expect_path2_capped(lab, steer, kRate);
}
