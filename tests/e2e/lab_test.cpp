// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The test bed itself: two namespaces, two paths, kernel MPTCP opening both subflows, and
// a transfer arriving intact. Everything else in e2e builds on this.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <linux/mptcp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "lab/lab.h"
#include "net/stats.h"

using namespace mpsteer::lab;
using mpsteer::net::median;
using mpsteer::net::quantile;
using namespace std::chrono_literals;

TEST_CASE("lab: two subflows over two paths, tokens as the kernel reports", "[e2e][lab]") {
    Lab::cleanup_stale();  // leftovers of a crashed run
    std::string prefix;
    {
        LabConfig cfg;
        cfg.tag = "l" + std::to_string(getpid() % 1000000);
        // Path 1 capped, so the scheduler has to put data on path 2: unshaped, a busy machine
        // once left it all on path 1 (5 KB of 64 MB on path 2, the join and ACKs).
        cfg.path[0] = PathShape{0, 200000};
        Lab lab(cfg);
        prefix = lab.prefix();
        MptcpMonitor mon_srv(lab.server_ns()), mon_cli(lab.client_ns());
        Sink sink(lab.server_ns(), 5201);
        TrafficStats sent = send_stream(lab.client_ns(), Lab::server_addr(1), 5201,
                                        SendOptions::of_bytes(64ull << 20));
        TrafficStats got = sink.wait(20s);
        CHECK(got.bytes == sent.bytes);
        CHECK(got.checksum == sent.checksum);
        CHECK_FALSE(sent.fallback);
        CHECK(sent.token != 0);
        CHECK(got.token != 0);
        CHECK(sent.token != got.token);  // each side has its own key, hence its own token

        std::vector<MptcpEvent> srv, cli;
        for (int i = 0; i < 10; i++) {
            for (auto& e : mon_srv.poll(100ms)) srv.push_back(e);
            for (auto& e : mon_cli.poll(0ms)) cli.push_back(e);
        }
        auto count = [](const auto& v, uint32_t type, uint32_t token) {
            return std::count_if(v.begin(), v.end(), [&](const MptcpEvent& e) {
                return e.type == type && e.token == token;
            });
        };
        for (auto& e : srv) INFO("server: " << to_string(e));
        CHECK(count(srv, MPTCP_EVENT_CREATED, got.token) == 1);
        CHECK(count(srv, MPTCP_EVENT_SUB_ESTABLISHED, got.token) == 1);
        CHECK(count(cli, MPTCP_EVENT_CREATED, sent.token) == 1);
        CHECK(count(cli, MPTCP_EVENT_SUB_ESTABLISHED, sent.token) == 1);
        auto sf = std::find_if(srv.begin(), srv.end(), [](const MptcpEvent& e) {
            return e.type == MPTCP_EVENT_SUB_ESTABLISHED;
        });
        REQUIRE(sf != srv.end());
        CHECK(sf->saddr == Lab::server_addr(2));
        CHECK(sf->daddr == Lab::client_addr(2));
        // Both paths carried data; 20 KB is more than the join's handshake and pure ACKs
        // bring, so data went there.
        CHECK(link_counters(lab.server_ns(), lab.server_if(1)).rx_bytes > 1000000);
        CHECK(link_counters(lab.server_ns(), lab.server_if(2)).rx_bytes > 20000);
    }
    CHECK_FALSE(std::filesystem::exists("/run/netns/" + prefix + "-cli"));
    CHECK_FALSE(std::filesystem::exists("/run/netns/" + prefix + "-srv"));
}

TEST_CASE("lab: a download after request/reply exchanges starts after the last request",
          "[e2e][lab]") {
    LabConfig cfg;
    cfg.tag = "lx" + std::to_string(getpid() % 1000000);
    cfg.ipv6 = false;
    cfg.path[0] = PathShape{25, 0};  // RTT 50 ms: the exchange's round trips show in the time
    Lab lab(cfg);

    SECTION("each exchange is one round trip more, and only the stream is counted") {
        SendOptions opt = SendOptions::of_bytes(10'000);
        opt.requests = 2;
        Source source(lab.server_ns(), 7101, opt);
        TrafficStats rx = receive_stream(lab.client_ns(), Lab::server_addr(1), 7101, 10s, {}, 2);
        TrafficStats tx = source.wait(10s);
        CHECK(rx.bytes == 10'000);
        CHECK(rx.checksum == tx.checksum);
        // Request, reply, request, then the stream's first byte: two round trips at least
        // (the delay line holds every frame 25 ms each way), where no exchange takes one half.
        CHECK(rx.seconds >= 0.099);
    }
    SECTION("a client that closes inside the exchange ends the source with an error") {
        SendOptions opt = SendOptions::of_bytes(10'000);
        opt.requests = 1;
        Source source(lab.server_ns(), 7102, opt);
        // 100 bytes of a 256-byte request, then the close.
        send_stream(lab.client_ns(), Lab::server_addr(1), 7102, SendOptions::of_bytes(100));
        REQUIRE_THROWS_WITH(source.wait(10s),
                            Catch::Contains("source: the peer closed during the exchange"));
    }
}

TEST_CASE("lab: an interactive stream gets each echo one round trip after its message",
          "[e2e][lab]") {
    LabConfig cfg;
    cfg.tag = "le" + std::to_string(getpid() % 1000000);
    cfg.ipv6 = false;
    cfg.path[0] = PathShape{25, 0};  // RTT 50 ms
    Lab lab(cfg);
    Echo echo(lab.server_ns(), 7103);
    bool fallback = true;
    const auto exchanges =
        interactive_stream(lab.client_ns(), Lab::server_addr(1), 7103, 1000ms, 100ms, &fallback);
    CHECK_FALSE(fallback);
    // A message every 100 ms, each answered one round trip later: the delay line holds every
    // frame 25 ms each way, so no reply is early; a reply the machine is slow to deliver
    // makes the stream skip a slot, so the count and the typical round trip are checked,
    // not every gap.
    REQUIRE(exchanges.size() >= 7);
    REQUIRE(exchanges.size() <= 10);
    std::vector<std::chrono::steady_clock::duration> rtts;
    for (size_t i = 0; i < exchanges.size(); i++) {
        rtts.push_back(exchanges[i].replied - exchanges[i].sent);
        CHECK(rtts.back() >= 50ms);
        if (i) CHECK(exchanges[i].sent - exchanges[i - 1].sent >= 90ms);  // paced, not sent at once
    }
    std::nth_element(rtts.begin(), rtts.begin() + rtts.size() / 2, rtts.end());
    CHECK(rtts[rtts.size() / 2] < 75ms);
}

TEST_CASE("lab: a blackholed path carries nothing while its links stay up, then carries again",
          "[e2e][lab]") {
    LabConfig cfg;
    cfg.tag = "lb" + std::to_string(getpid() % 1000000);
    cfg.signal = false;             // one subflow: the download has only path 1
    cfg.path[0] = PathShape{5, 0};  // a delay line, which the blackhole is part of
    Lab lab(cfg);
    // What the application has read (the interface's own counters also see frames the
    // delay namespace's interface sends itself, IPv6 neighbour discovery).
    std::atomic<uint64_t> read{0};
    auto rx = [&] { return read.load(); };
    std::atomic<bool> stop{false};
    // Over IPv6 (the Source listens on both families), to the server's path-1 address.
    Source source(lab.server_ns(), 7103, SendOptions::of_time(30s, &stop), true);
    auto download = std::async(std::launch::async, [&] {
        return receive_stream(lab.client_ns(), Lab::server_addr6(1), 7103, 60s,
                              [&](uint64_t n) { read = n; });
    });
    std::this_thread::sleep_for(500ms);
    lab.blackhole(1, true);
    std::this_thread::sleep_for(200ms);  // what the relay held already has arrived
    const uint64_t before = rx();
    std::this_thread::sleep_for(1s);
    CHECK(rx() == before);
    const std::string up =
        must({"ip", "-n", lab.client_ns(), "-o", "link", "show", lab.client_if(1)});
    CHECK(up.find("state UP") != std::string::npos);
    lab.blackhole(1, false);
    // The sender's retransmission gets through once its backed-off timer fires.
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (rx() < before + 100'000 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(100ms);
    CHECK(rx() >= before + 100'000);
    stop = true;
    const TrafficStats got = download.get();
    const TrafficStats sent = source.wait(10s);
    CHECK(got.bytes == sent.bytes);
    CHECK(got.checksum == sent.checksum);
    CHECK_THROWS_AS(lab.blackhole(2, true), Error);  // path 2 has no delay line
}

TEST_CASE("lab: a root without the lab's commands is told which packages to install",
          "[e2e][lab]") {
    const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
    const auto empty = std::filesystem::temp_directory_path() / "mpsteer-lab-empty-path";
    std::filesystem::create_directories(empty);
    setenv("PATH", empty.c_str(), 1);
    std::string what;
    try {
        mpsteer::lab::Lab::require_tools();
    } catch (const std::exception& e) {
        what = e.what();
    }
    setenv("PATH", path.c_str(), 1);
    std::filesystem::remove(empty);
    CHECK(what.find("sysctl (package procps)") != std::string::npos);
    CHECK(what.find("ethtool (package ethtool)") != std::string::npos);
    CHECK(what.find("ip (package iproute2)") != std::string::npos);
    CHECK(what.find("apt-get install ethtool iproute2 procps") != std::string::npos);
    // With this machine's PATH nothing is missing.
    CHECK_NOTHROW(mpsteer::lab::Lab::require_tools());
}

TEST_CASE("lab: offloads as a host has them, or none and every checksum verified", "[e2e][lab]") {
    for (Offloads mode : {Offloads::host, Offloads::strict}) {
        INFO("offloads: " << to_string(mode));
        Lab::cleanup_stale();
        LabConfig cfg;
        cfg.tag = std::string("k") + to_string(mode)[0] + std::to_string(getpid() % 10000);
        cfg.offloads = mode;
        Lab lab(cfg);
        // What the interfaces offload: everything a host does by default, or nothing.
        const std::string on = mode == Offloads::host ? "on" : "off";
        for (const auto& [ns, dev] : {std::pair{lab.client_ns(), lab.client_if(1)},
                                      std::pair{lab.server_ns(), lab.server_if(2)}}) {
            const std::string k = must({"ip", "netns", "exec", ns, "ethtool", "-k", dev});
            for (const char* f :
                 {"tx-checksumming", "tcp-segmentation-offload", "generic-segmentation-offload",
                  "generic-receive-offload", "rx-checksumming"})
                CHECK_THAT(k, Catch::Contains(std::string(f) + ": " + on));
        }
        // A segment with a wrong checksum from the client (a raw socket: the stack leaves the
        // TCP header as given, with no checksum offload): the server's TCP checks it and
        // counts it. (With checksum offload, what the stack sends carries the pseudo-header's
        // sum and the receiving veth's peer trusts it: only the strict mode verifies what an
        // actor at TC egress wrote.)
        {
            NetnsGuard in(lab.client_ns());
            int fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_TCP);
            REQUIRE(fd >= 0);
            tcphdr syn{};
            syn.source = htons(40000);
            syn.dest = htons(5201);
            syn.seq = htonl(1);
            syn.doff = 5;
            syn.syn = 1;
            syn.window = htons(1000);
            syn.check = htons(0x1234);  // not the checksum of this segment
            sockaddr_in to{};
            to.sin_family = AF_INET;
            inet_pton(AF_INET, Lab::server_addr(1).c_str(), &to.sin_addr);
            CHECK(sendto(fd, &syn, sizeof syn, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) ==
                  ssize_t(sizeof syn));
            close(fd);
        }
        uint64_t errors = 0;
        for (int i = 0; i < 50 && !errors; ++i) {
            std::this_thread::sleep_for(20ms);
            errors = tcp_counters(lab.server_ns()).at("InCsumErrors");
        }
        CHECK(errors == 1);
    }
}

TEST_CASE("lab: quantiles by nearest rank, as every benchmark reports them", "[e2e][lab]") {
    std::vector<double> twenty;
    for (int i = 20; i >= 1; --i) twenty.push_back(i);  // unsorted on purpose
    CHECK(quantile(twenty, 0.5) == 10);
    CHECK(quantile(twenty, 0.95) == 19);  // 0.95 * 20 is not exactly 19 in binary
    CHECK(quantile(twenty, 0.99) == 20);
    CHECK(quantile(twenty, 0.0) == 1);
    CHECK(quantile(twenty, 1.0) == 20);
    CHECK(median({5, 1, 3}) == 3);
    CHECK(median({4, 1, 3, 2}) == 2);  // of an even count, the lower middle
    CHECK(median({}) == 0);
}
