// The scripts' view of the real datapath: connections and subflows from the shared `conns` and
// `flows` maps (bytes, packets, srtt/rttvar from `record`), overlaid with TCP_INFO from
// sock_diag for the subflows whose sockets this host owns (srtt, rttvar, cwnd, bytes in flight,
// not-sent bytes, delivery rate; this kernel has no kprobes or fentry), and the scripts'
// decisions as in-place writes: rates through the control program (MPS_CTL_RATE, never a
// whole-value write), add_subflow / block through ActorMaps. Sockets are those of the calling
// thread's network namespace. Errors are exceptions (the script gets them as Lua errors).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "datapath/actors.h"
#include "datapath/datapath.h"
#include "lua/hooks.h"

namespace mpsteer::lua {

class DatapathBackend : public Backend {
public:
    explicit DatapathBackend(const datapath::StateMaps& state);

    std::vector<Connection> connections() override;
    std::optional<Connection> connection(uint32_t token) override;
    std::optional<Subflow> subflow(uint64_t id) override;
    bool set_subflow(const std::string& policy, uint64_t id, const SubflowSettings& s) override;
    bool add_subflow(const std::string& policy, uint32_t token, uint8_t addr_id) override;
    bool block_address(const std::string& policy, uint32_t token, uint8_t addr_id) override;
    int set_policy_backup(const std::string& policy, bool backup) override;
    // The running generation (set_policy_backup writes its steps); null: none.
    void set_generation(datapath::Generation* g) { gen_ = g; }

    // Turns a datapath event into hook calls: MP_CAPABLE with both tokens -> on_connection
    // (once per connection: the later events that repeat the keys are not passed on),
    // MP_JOIN -> on_subflow, FLOW_CLOSED -> on_subflow_closed, ADD_ADDR blocked ->
    // on_add_addr_blocked (with the connection's token from the flow entry). The tables passed
    // are built from the flow entry the event carries (the event reader looked it up; no map
    // access here, no scan, no sock_diag): cheap enough for the event path; scripts ask
    // mpsteer.connection() for TCP_INFO.
    void dispatch(HookSet& hooks, const datapath::Event& ev);

    // Whether to ask sock_diag (default on); off on a middle host saves the dump.
    void use_sock_diag(bool on) { sock_diag_ = on; }

    uint64_t id_of(const mps_flow_key& k);
    std::optional<mps_flow_key> key_of(uint64_t id) const;

private:
    Subflow make_subflow(const mps_flow_key& k, const mps_flow& f);
    void overlay_tcp_info(std::vector<Connection>& conns);
    std::vector<Connection> read(std::optional<uint32_t> only);
    const datapath::StateMaps& state_;
    datapath::ActorMaps actors_;
    std::map<std::string, uint64_t> ids_;  // flow key bytes -> id
    std::map<uint64_t, mps_flow_key> keys_;
    std::map<std::string, uint32_t> connected_;  // flow key bytes -> token on_connection saw
    uint64_t next_id_ = 1;
    bool sock_diag_ = true;
    datapath::Generation* gen_ = nullptr;
};

// TCP_INFO of this network namespace's TCP sockets, keyed by their unordered 4-tuple
// (the key canonical_pair() gives for a flow key). One netlink dump per call.
struct TcpInfo {
    uint32_t srtt_us = 0, rttvar_us = 0;
    uint64_t cwnd_bytes = 0, inflight_bytes = 0, notsent_bytes = 0, delivery_rate = 0;
    uint64_t bytes_acked = 0, bytes_received = 0;
};
std::map<std::string, TcpInfo> tcp_sockets();
std::string canonical_pair(const mps_flow_key& k);

}  // namespace mpsteer::lua
