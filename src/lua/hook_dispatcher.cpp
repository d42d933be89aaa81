// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lua/hook_dispatcher.h"
#include "net/address.h"

#include <arpa/inet.h>

#include <algorithm>

namespace mpsteer::lua {

void HookDispatcher::dispatch(Hooks& hooks, const datapath::Event& ev) {
    if (hooks.size() == 0) return;
    const auto& r = ev.raw;
    const mps_flow& f = ev.flow;  // the event reader's lookup, with its own writes applied
    const bool have = ev.have_flow;
    switch (r.type) {
    case MPS_EV_MP_CAPABLE: {
        if (!ev.token_a || !ev.token_b) return;  // keys incomplete: the later event reports it
        Connection c;
        c.token = std::min(ev.token_a, ev.token_b);
        c.token_b = std::max(ev.token_a, ev.token_b);
        // Once per connection: the SYN/ACK, the third ACK and the first data packet all carry
        // keys (v1), so up to three events follow one another with both tokens known.
        const uint64_t id = ids_.id_of(r.flow);
        connected_.erase(connected_.begin(), connected_.lower_bound(ids_.oldest()));
        auto [seen, fresh] = connected_.try_emplace(id, c.token);
        if (!fresh && seen->second == c.token) return;
        seen->second = c.token;  // the 4-tuple of a new connection (its close went unseen)
        // From the event's own flow entry only (the reader's lookup): no map scan, no sock_diag
        // dump on the event path; mpsteer.connection(token) has the full view. The connection has
        // one subflow yet: its counters are the connection's (the connection entry, which the event
        // reader has just created, counts only from then on).
        if (have) {
            c.subflows.push_back(make_subflow(ids_, r.flow, f));
            c.bytes = c.subflows.front().bytes;
            c.packets = c.subflows.front().packets;
        }
        hooks.on_connection(c);
        break;
    }
    case MPS_EV_MP_JOIN: {
        if (!have) return;
        auto s = make_subflow(ids_, r.flow, f);
        hooks.on_subflow(s);
        break;
    }
    case MPS_EV_FLOW_CLOSED: {
        Subflow s = have ? make_subflow(ids_, r.flow, f) : Subflow{};
        if (!have) {
            s.id = ids_.id_of(r.flow);
            s.a = net::endpoint_text(r.flow.family, r.flow.a, r.flow.port_a);
            s.b = net::endpoint_text(r.flow.family, r.flow.b, r.flow.port_b);
        }
        hooks.on_subflow_closed(s);
        // Forget the handle (the id map would otherwise grow with every flow ever seen); a
        // later packet of the same 4-tuple gets a new id.
        connected_.erase(s.id);
        ids_.forget(r.flow);
        break;
    }
    case MPS_EV_ADD_ADDR_BLOCKED: {
        const auto fields = datapath::decode(r);
        AddAddr a;
        a.token = have ? f.conn_token : 0;
        a.address = fields.address;
        a.port = fields.port;
        a.addr_id = r.addr_id;
        a.subflow = datapath::to_string(r.flow);
        hooks.on_add_addr_blocked(a);
        break;
    }
    default: break;
    }
}

}  // namespace mpsteer::lua
