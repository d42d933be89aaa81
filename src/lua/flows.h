// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The scripts' handles for flows, and a flow entry as a script sees it. Shared by what the
// scripts call (DatapathBackend) and what calls the scripts (HookDispatcher), both on the event
// thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "datapath/datapath.h"
#include "lua/hooks.h"

namespace mpsteer::lua {

// Flow key <-> the id scripts hold (Subflow::id): stable while the flow lives, forgotten when
// it closes (a later flow with the same 4-tuple gets a new id). Bounded: past `capacity` flows
// the oldest id goes, as the datapath's LRU flow table forgets its oldest flows; a remote host
// opening connections it never closes cannot grow the agent.
class FlowIds {
public:
    explicit FlowIds(size_t capacity = datapath::TableSizes::kDefaultFlows)
        : capacity_(capacity ? capacity : 1) {}
    uint64_t id_of(const mps_flow_key& k);
    std::optional<mps_flow_key> key_of(uint64_t id) const;
    void forget(const mps_flow_key& k);
    size_t size() const { return keys_.size(); }
    // Every id below this one is forgotten (ids only grow).
    uint64_t oldest() const { return keys_.empty() ? next_id_ : keys_.begin()->first; }

private:
    size_t capacity_;
    std::map<std::string, uint64_t> ids_;  // flow key bytes -> id
    std::map<uint64_t, mps_flow_key> keys_;
    uint64_t next_id_ = 1;
};

// The flow key's bytes, as a map key.
std::string key_bytes(const mps_flow_key& k);
// A flow entry as a script's subflow table (without TCP_INFO).
Subflow make_subflow(FlowIds& ids, const mps_flow_key& k, const mps_flow& f);

}  // namespace mpsteer::lua
