// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// `mpsteer bench --live` as a user runs it, one short round: every case moves data and the
// figures come from where they should (the programs' run time only where programs ran, more
// of it for a chain than for the bare program). Timings are not asserted: the benchmark prints
// them.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>

#include "agent_harness.h"
#include "lab/lab.h"

using namespace mpsteer;
using namespace mpsteer::agent_e2e;
using nlohmann::json;

TEST_CASE("bench --live: one round prints every case's figures, the programs' time where they ran",
          "[bench]") {
    lab::Lab::cleanup_stale();
    const auto r = lab::run({"sh", "-c",
                             mpsteer_bin() + " bench --live --rounds 1 --seconds 1 --prog-times "
                                             "--cases record_only,iperf3 --json 2>/dev/null"});
    INFO(r.out);
    REQUIRE(r.status == 0);
    const json out = json::parse(r.out);
    CHECK(out.at("rounds") == 1);
    for (const char* c : {"none", "bare_xdp", "record_only", "iperf3"}) {
        INFO(c);
        CHECK(out.at(c).at("gbit_per_s").get<double>() > 0);
        CHECK(out.at(c).at("cpu_s_per_gb").get<double>() > 0);
    }
    CHECK(out.at("none").at("programs_cpu_s_per_gb").get<double>() == 0);
    // iperf3 over MPTCP through the shim moves the data with nothing attached.
    CHECK(out.at("iperf3").at("programs_cpu_s_per_gb").get<double>() == 0);
    const double bare = out.at("bare_xdp").at("programs_cpu_s_per_gb").get<double>();
    CHECK(bare > 0);
    CHECK(out.at("bare_xdp").at("server_xdp_ns_per_run").get<double>() > 0);
    CHECK_FALSE(out.at("bare_xdp").contains("server_tc_egress_ns_per_run"));
    // record at XDP and TC egress of both hosts: a flow lookup and its accounting per packet
    // at two hooks, against an XDP_PASS at one.
    const json& rec = out.at("record_only");
    CHECK(rec.at("programs_cpu_s_per_gb").get<double>() > bare);
    CHECK(rec.at("server_tc_egress_ns_per_run").get<double>() > 0);
    CHECK(rec.at("client_chain_packets").get<double>() > 0);
    CHECK(rec.contains("programs_cpu_s_per_gb_over_bare"));
    CHECK(rec.contains("machine_cpu_s_per_gb_over_bare"));
    CHECK(out.at("agent_idle").at("rss_mb").get<double>() > 0);
}

TEST_CASE("bench --live --sender iperf3: every case's data moved by iperf3 over MPTCP", "[bench]") {
    lab::Lab::cleanup_stale();
    const auto refused = lab::run({"sh", "-c",
                                   mpsteer_bin() + " bench --live --rounds 1 --seconds 1 "
                                                   "--sender iperf3 --cases iperf3 2>&1"});
    CHECK(refused.status != 0);
    CHECK(refused.out.find("the iperf3 case would repeat none") != std::string::npos);

    const auto r = lab::run({"sh", "-c",
                             mpsteer_bin() + " bench --live --rounds 1 --seconds 1 --prog-times "
                                             "--sender iperf3 --cases record_only --json "
                                             "2>/dev/null"});
    INFO(r.out);
    REQUIRE(r.status == 0);
    const json out = json::parse(r.out);
    CHECK(out.at("sender") == "iperf3");
    for (const char* c : {"none", "bare_xdp", "record_only"}) {
        INFO(c);
        CHECK(out.at(c).at("gbit_per_s").get<double>() > 0);
        // The client's subflow endpoint joins iperf3's connections like the lab's own.
        CHECK(out.at(c).at("extra_subflows").get<double>() >= 1);
    }
    const json& rec = out.at("record_only");
    CHECK(rec.at("client_chain_packets").get<double>() > 0);
    CHECK(rec.at("programs_cpu_s_per_gb").get<double>() >
          out.at("bare_xdp").at("programs_cpu_s_per_gb").get<double>());
}
