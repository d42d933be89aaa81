// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What the scripts call on the real datapath: connections and subflows from the shared `conns`
// and `flows` maps (bytes, packets, srtt/rttvar from `record`), overlaid with TCP_INFO from
// sock_diag for the subflows whose sockets this host owns (srtt, rttvar, cwnd, bytes in flight,
// not-sent bytes, delivery rate; this kernel has no kprobes or fentry), and the scripts'
// decisions as in-place writes: rates through the control program (MPS_CTL_RATE, never a
// whole-value write), add_subflow / block through ActorMaps, a set_backup step's B flag as a
// request on the StepWriteQueue (the agent's rollout is the generation's only writer). Sockets
// are those of the calling thread's network namespace. Errors are exceptions (the script gets
// them as Lua errors). Used on the event thread only.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapath/actors.h"
#include "datapath/datapath.h"
#include "lua/flows.h"
#include "lua/hooks.h"
#include "lua/step_writes.h"
#include "net/mptcp_pm.h"

namespace mpsteer::lua {

class DatapathBackend : public Backend {
public:
    DatapathBackend(const datapath::StateMaps& state, FlowIds& ids, StepWriteQueue& step_writes);

    std::vector<Connection> connections() override;
    std::optional<Connection> connection(uint32_t token) override;
    std::optional<Subflow> subflow(uint64_t id) override;
    bool set_subflow(const std::string& policy, uint64_t id, const SubflowSettings& s) override;
    bool add_subflow(const std::string& policy, uint32_t token, uint8_t addr_id) override;
    bool block_address(const std::string& policy, uint32_t token, uint8_t addr_id) override;
    // Counts the policy's set_backup steps in the running generation and queues their new B
    // flag for the agent, which writes them within milliseconds.
    int set_policy_backup(const std::string& policy, bool backup) override;
    // Known when a walk found no connection with a live subflow and none was inserted since.
    bool no_connections() override { return idle_at_inserts_ == datapath::conn_inserts(); }
    // The path manager of the agent's network namespace. An endpoint is renewed at most once
    // every kRenewGap (false meanwhile): a path probed that often costs one SYN each time.
    std::vector<Endpoint> endpoints() override;
    bool renew_endpoint(const std::string& policy, const std::string& address) override;
    static constexpr std::chrono::milliseconds kRenewGap{500};
    // Renewals so far, by address: {address, renewals, refused, last_policy, last_unix_ms}.
    nlohmann::json paths_json() const;

    // The generation set_policy_backup addresses; nullopt: none runs.
    void set_running(std::optional<RunningGeneration> g) { running_ = std::move(g); }

private:
    void overlay_tcp_info(std::vector<Connection>& conns);
    std::vector<Connection> read(std::optional<uint32_t> only);
    const datapath::StateMaps& state_;
    datapath::ActorMaps actors_;
    FlowIds& ids_;
    StepWriteQueue& step_writes_;
    std::optional<RunningGeneration> running_;
    net::MptcpPathManager& path_manager();
    std::unique_ptr<net::MptcpPathManager> pm_;
    struct Renewals {
        uint64_t done = 0, refused = 0;
        std::string last_policy;
        std::chrono::steady_clock::time_point last_at;
        int64_t last_unix_ms = 0;
    };
    std::map<std::string, Renewals> renewals_;
    // conn_inserts() when a walk last found no connection (none: it found some).
    std::optional<uint64_t> empty_at_inserts_;
    // conn_inserts() when a walk last found no connection with a subflow not closed.
    std::optional<uint64_t> idle_at_inserts_;
};

// TCP_INFO of this network namespace's TCP sockets, keyed by their unordered 4-tuple
// (the key canonical_pair() gives for a flow key). One netlink dump per call.
struct TcpInfo {
    uint32_t srtt_us = 0, rttvar_us = 0;
    uint64_t cwnd_bytes = 0, inflight_bytes = 0, notsent_bytes = 0, delivery_rate = 0;
    uint64_t bytes_acked = 0, bytes_received = 0;
    uint32_t last_data_recv_ms = 0, last_ack_recv_ms = 0;
    std::string local_address;  // the socket's own address, as text
};
std::map<std::string, TcpInfo> tcp_sockets();
std::string canonical_pair(const mps_flow_key& k);

}  // namespace mpsteer::lua
