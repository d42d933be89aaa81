// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The chain set (structural checks, deterministic serialisation) and MPTCP token derivation.
#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <cstring>
#include <string>

#include "datapath/chain.h"
#include "datapath/datapath.h"

using namespace mpsteer::datapath;

namespace {
ChainSet linear(size_t selectors, mps_prog last = MPS_ACT_PASS) {
    ChainSet c;
    for (size_t i = 0; i < selectors; ++i)
        c.steps.push_back(port_match(PortDir::src, 1, 1).step(static_cast<uint16_t>(i + 1)));
    c.steps.push_back(make_step(last, MPS_PC_END));
    c.entries.push_back({Hook::xdp, "", 0});
    c.policies.push_back("p");
    return c;
}

bool mentions(const std::vector<std::string>& problems, const std::string& what) {
    for (const auto& p : problems)
        if (p.find(what) != std::string::npos) return true;
    return false;
}
}  // namespace

TEST_CASE("a 32-step chain is accepted, 33 steps are not", "[chain]") {
    CHECK(linear(31).check().empty());
    auto problems = linear(32).check();
    REQUIRE(problems.size() == 1);
    CHECK(mentions(problems, "33 steps, more than 32"));
}

TEST_CASE("cycles, dangling targets and unknown programs are rejected", "[chain]") {
    auto c = linear(2);
    c.steps[1].on_miss = 0;  // back to the start
    CHECK(mentions(c.check(), "cycle"));

    c = linear(2);
    c.steps[0].on_match = 7;
    CHECK(mentions(c.check(), "on_match out of range"));

    c = linear(1);
    c.steps[0].prog = 17;
    CHECK(mentions(c.check(), "unknown program 17"));

    c = linear(1);
    c.entries.push_back({Hook::tc_egress, "", 9});
    CHECK(mentions(c.check(), "entry tc_egress: pc out of range"));
}

TEST_CASE("more than 16 program steps on a path exceed the tail-call budget", "[chain]") {
    ChainSet c;
    for (uint16_t i = 0; i < 17; ++i) c.steps.push_back(make_step(MPS_ACT_RECORD, i + 1));
    c.steps.push_back(make_step(MPS_ACT_PASS, MPS_PC_END));
    c.entries.push_back({Hook::xdp, "", 0});
    CHECK(mentions(c.check(), "enters 17 programs, more than 16"));
    c.steps.erase(c.steps.begin());
    for (auto& s : c.steps)
        if (s.on_match != MPS_PC_END) s.on_match--;
    CHECK(c.check().empty());
}

TEST_CASE("serialisation is byte-identical for equal chain sets and differs otherwise", "[chain]") {
    auto a = linear(3), b = linear(3);
    CHECK(a.serialize() == b.serialize());
    b.steps[1].p.match.hi[0] = 80;
    CHECK(a.serialize() != b.serialize());
    b = linear(3);
    b.attachments.push_back({"eth0", Hook::xdp});
    CHECK(a.serialize() != b.serialize());
}

TEST_CASE("describe names programs, targets and policies", "[chain]") {
    auto c = linear(1);
    c.steps[0] = port_match(PortDir::dst, 80, 443).step(1);
    auto text = c.describe();
    CHECK(text.find("entry xdp -> 0") != std::string::npos);
    CHECK(text.find("0: sel_match dport&0xffff in 0x50-0x1bb match->1 miss->end [p]") !=
          std::string::npos);
    CHECK(text.find("1: act_pass match->end [p]") != std::string::npos);
}

TEST_CASE("program names round-trip and inline steps have no program", "[chain]") {
    for (int p = 0; p < MPS_PROG_MAX; ++p) {
        auto name = prog_name(static_cast<mps_prog>(p));
        if (name == "none") continue;
        CHECK(prog_from_name(name) == static_cast<mps_prog>(p));
    }
    CHECK_FALSE(has_program(MPS_SEL_MATCH));
    CHECK_FALSE(has_program(MPS_ACT_DROP));
    CHECK(has_program(MPS_SEL_TOKEN));
    CHECK(has_program(MPS_ACT_RATE_LIMIT));
    // The registry's names say what its values say: selectors below MPS_ACT_PASS, actors from it.
    int rows = 0;
#define MPS_PROG_ROW(e, value, name, inl, options)                                      \
    ++rows;                                                                             \
    CHECK(std::string_view(#name).starts_with(MPS_PROG_IS_ACTOR(e) ? "act_" : "sel_")); \
    CHECK(prog_name(e) == #name);
    MPS_PROGRAMS(MPS_PROG_ROW)
#undef MPS_PROG_ROW
    CHECK(rows == 16);
}

TEST_CASE(
    "MPTCP token and IDSN are the two ends of one SHA-256 of the key on the wire "
    "(RFC 8684 3.1)",
    "[token]") {
    // Digests computed independently: python3 hashlib.sha256(bytes.fromhex(...)).hexdigest()
    // (the keys of tests/bpf). The token is the digest's first 4 bytes, the IDSN its last 8.
    struct Case {
        unsigned char wire[8];
        const char* digest;
    };
    const Case cases[] = {
        {{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef},
         "55c53f5d490297900cefa825d0c8e8e9532ee8a118abe7d8570762cd38be9818"},
        {{0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10},
         "18f9781b1b2c2d85dc80ea6af8a7acf9bf1911a768411d39280818bf0fa7e28e"},
    };
    for (const auto& c : cases) {
        uint64_t key;
        std::memcpy(&key, c.wire, sizeof key);
        const std::string d = c.digest;
        const MptcpKeyIds ids = mptcp_key_ids(key);
        INFO("digest " << d);
        CHECK(ids.token == std::stoul(d.substr(0, 8), nullptr, 16));
        CHECK(ids.idsn == std::stoull(d.substr(48, 16), nullptr, 16));
    }
    // The first vector's figures as the earlier test had them.
    uint64_t key;
    std::memcpy(&key, cases[0].wire, sizeof key);
    CHECK(mptcp_key_ids(key).token == 0x55c53f5du);
    CHECK(mptcp_key_ids(key).idsn == 0x570762cd38be9818ULL);
}

TEST_CASE("flow keys print as endpoints, IPv6 in brackets", "[chain]") {
    mps_flow_key v4{};
    v4.family = 4;
    const uint8_t a4[4] = {10, 0, 1, 1}, b4[4] = {10, 0, 2, 2};
    std::memcpy(v4.a, a4, 4);
    std::memcpy(v4.b, b4, 4);
    v4.port_a = 40000;
    v4.port_b = 80;
    CHECK(mpsteer::datapath::to_string(v4) == "10.0.1.1:40000 <-> 10.0.2.2:80");

    mps_flow_key v6{};
    v6.family = 6;
    const uint8_t a6[16] = {0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    std::memcpy(v6.a, a6, 16);
    std::memcpy(v6.b, a6, 16);
    v6.b[3] = htonl(2);
    v6.port_a = 1;
    v6.port_b = 2;
    CHECK(mpsteer::datapath::to_string(v6) == "[fd00:1::1]:1 <-> [fd00:1::2]:2");
}
