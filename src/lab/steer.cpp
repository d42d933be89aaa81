// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The datapath inside the lab: the server's chains, loading and attaching them inside a
// namespace, reading the shared state back, and the kernel's per-subflow byte counters.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <spdlog/spdlog.h>

#include "lab/lab.h"

namespace fs = std::filesystem;

namespace mpsteer::lab {

using namespace mpsteer::datapath;

// ---- kernel counters -----------------------------------------------------------------------

std::vector<SubflowInfo> tcp_subflows(const std::string& netns) {
    std::vector<SubflowInfo> out;
    std::istringstream in(must_in(netns, {"ss", "-Htni", "state", "established"}));
    // Each socket: "Recv-Q Send-Q local peer" (state filtered out), then indented details.
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        std::istringstream f(line);
        if (line[0] != ' ' && line[0] != '\t') {
            SubflowInfo s;
            std::string rq, sq;
            f >> rq >> sq >> s.local >> s.remote;
            out.push_back(s);
            continue;
        }
        if (out.empty()) continue;
        std::string prev;
        for (std::string w; f >> w; prev = w) {
            auto num = [&](const char* key, uint64_t& v) {
                if (w.rfind(key, 0) == 0) v = std::stoull(w.substr(std::strlen(key)));
            };
            num("bytes_acked:", out.back().bytes_acked);
            num("bytes_received:", out.back().bytes_received);
            if (prev == "tcp-ulp-mptcp" && w.rfind("flags:", 0) == 0)
                out.back().mptcp_flags = w.substr(6);
        }
    }
    return out;
}

// ---- chains --------------------------------------------------------------------------------

ChainSet server_chains(const Lab& lab, uint64_t rate_bytes_per_sec) {
    ChainSet c;
    c.policies = {"observe", "limit-path2"};
    // XDP ingress: everything the client sends (data, MP_CAPABLE third ACK, MP_JOIN SYN).
    c.steps.push_back(make_step(MPS_ACT_RECORD, 1));
    c.steps.push_back(make_step(MPS_ACT_GET_CONNECT, 2));
    c.steps.push_back(make_step(MPS_ACT_GET_SUBFLOW, MPS_PC_END));
    // TC egress: the server's ACKs (record closes the RTT samples XDP opened, and vice versa;
    // the SYN/ACK carries the server's key).
    const bool limit = rate_bytes_per_sec > 0;
    c.steps.push_back(make_step(MPS_ACT_RECORD, 4));
    c.steps.push_back(make_step(MPS_ACT_GET_CONNECT, limit ? 5 : MPS_PC_END));
    if (limit) {
        uint32_t client2[4] = {};  // towards the client on path 2
        inet_pton(AF_INET, Lab::client_addr(2).c_str(), &client2[0]);
        c.steps.push_back(Match(4).prefix(MPS_W_DST, client2, 24).step(6, MPS_PC_END, 1));
        auto rl = make_step(MPS_ACT_RATE_LIMIT, MPS_PC_END, MPS_PC_END, 1);
        rl.p.rate.bytes_per_sec = rate_bytes_per_sec;
        rl.p.rate.rtt_us = 0;  // only act once record has measured the RTT
        rl.p.rate.min_window = 2 * 1448;
        c.steps.push_back(rl);
    }
    c.entries = {{Hook::xdp, "", 0}, {Hook::tc_egress, "", 3}};
    for (int p = 1; p <= 2; p++)
        for (Hook h : {Hook::xdp, Hook::tc_egress}) c.attachments.push_back({lab.server_if(p), h});
    return c;
}

// ---- Steering ------------------------------------------------------------------------------

std::string Steering::pin_root_for(const std::string& what) {
    const std::string kind = "mpsteer-" + what + "-";
    std::error_code ec;
    for (const auto& ent : fs::directory_iterator("/sys/fs/bpf", ec)) {
        std::string name = ent.path().filename();
        if (name.rfind(kind, 0) != 0) continue;
        pid_t pid = std::atoi(name.c_str() + kind.size());
        if (pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH)) continue;  // still running
        spdlog::info("removing stale pins {}", ent.path().string());
        fs::remove_all(ent.path(), ec);
    }
    return "/sys/fs/bpf/" + kind + std::to_string(getpid());
}

Steering::Steering(const ChainSet& chains, const std::string& netns, const std::string& pin_root)
    : netns_(netns), pin_root_(pin_root) {
    try {
        state_ = StateMaps::open(pin_root_);
        // Interface names resolve in the calling thread's namespace: build and attach there.
        NetnsGuard in(netns_);
        gen_ = Generation::build(chains, 1, state_);
        for (const auto& a : chains.attachments)
            links_.push_back(HookLink::attach(a.ifname, a.hook, gen_->entry_fd(a.hook, a.ifname)));
    } catch (...) {
        links_.clear();
        gen_.reset();
        std::error_code ec;
        fs::remove_all(pin_root_, ec);
        throw;
    }
}

Steering::~Steering() {
    try {
        if (fs::exists("/run/netns/" + netns_)) {
            NetnsGuard in(netns_);  // clsact filters are removed by ifindex, in the namespace
            links_.clear();
        }
    } catch (const std::exception& e) {
        spdlog::warn("steering: detaching in {}: {}", netns_, e.what());
    }
    links_.clear();
    gen_.reset();
    state_ = StateMaps{};
    std::error_code ec;
    fs::remove_all(pin_root_, ec);
    if (ec) spdlog::warn("steering: removing {}: {}", pin_root_, ec.message());
}

std::vector<std::pair<mps_flow_key, mps_flow>> Steering::flows() const {
    std::vector<std::pair<mps_flow_key, mps_flow>> out;
    mps_flow_key key{}, next{};
    const mps_flow_key* prev = nullptr;
    while (bpf_map_get_next_key(state_.flows(), prev, &next) == 0) {
        mps_flow f{};
        if (bpf_map_lookup_elem(state_.flows(), &next, &f) == 0) out.emplace_back(next, f);
        key = next;
        prev = &key;
    }
    return out;
}

std::optional<mps_conn> Steering::conn(uint32_t lower_token) const {
    mps_conn c{};
    if (bpf_map_lookup_elem(state_.conns(), &lower_token, &c) != 0) return std::nullopt;
    return c;
}

}  // namespace mpsteer::lab
