// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lua/flows.h"
#include "net/address.h"

#include <arpa/inet.h>

namespace mpsteer::lua {

std::string key_bytes(const mps_flow_key& k) {
    return std::string(reinterpret_cast<const char*>(&k), sizeof k);
}

uint64_t FlowIds::id_of(const mps_flow_key& k) {
    auto [it, fresh] = ids_.try_emplace(key_bytes(k), next_id_);
    if (!fresh) return it->second;
    keys_[next_id_++] = k;
    if (keys_.size() > capacity_) {
        auto oldest = keys_.begin();
        ids_.erase(key_bytes(oldest->second));
        keys_.erase(oldest);
    }
    return it->second;
}

std::optional<mps_flow_key> FlowIds::key_of(uint64_t id) const {
    auto it = keys_.find(id);
    if (it == keys_.end()) return std::nullopt;
    return it->second;
}

void FlowIds::forget(const mps_flow_key& k) {
    if (auto it = ids_.find(key_bytes(k)); it != ids_.end()) {
        keys_.erase(it->second);
        ids_.erase(it);
    }
}

Subflow make_subflow(FlowIds& ids, const mps_flow_key& k, const mps_flow& f) {
    Subflow s;
    s.id = ids.id_of(k);
    s.token = f.conn_token;
    s.a = net::endpoint_text(k.family, k.a, k.port_a);
    s.b = net::endpoint_text(k.family, k.b, k.port_b);
    s.bytes_ab = f.dir_ab.bytes;
    s.bytes_ba = f.dir_ba.bytes;
    s.bytes = s.bytes_ab + s.bytes_ba;
    s.packets = f.dir_ab.packets + f.dir_ba.packets;
    s.srtt_us = f.srtt_us;
    s.rttvar_us = f.rttvar_us;
    s.rate = f.rate_bps;
    s.backup = f.backup;
    s.join = f.role == MPS_ROLE_JOIN;
    return s;
}

}  // namespace mpsteer::lua
