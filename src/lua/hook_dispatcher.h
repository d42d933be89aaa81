// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What calls the scripts: turns a datapath event into hook calls on the event thread.
// MP_CAPABLE with both tokens -> on_connection (once per connection: the later events that
// repeat the keys are not passed on), MP_JOIN -> on_subflow, FLOW_CLOSED -> on_subflow_closed
// (and the flow's id is forgotten), ADD_ADDR blocked -> on_add_addr_blocked (with the
// connection's token from the flow entry). The tables passed are built from the flow entry the
// event carries (the event reader looked it up; no map access here, no scan, no sock_diag):
// cheap enough for the event path; scripts ask mpsteer.connection() for TCP_INFO.
#pragma once

#include <map>

#include "datapath/datapath.h"
#include "lua/flows.h"
#include "lua/hooks.h"

namespace mpsteer::lua {

class HookDispatcher {
public:
    explicit HookDispatcher(FlowIds& ids) : ids_(ids) {}
    void dispatch(Hooks& hooks, const datapath::Event& ev);
    size_t connections_tracked() const { return connected_.size(); }

private:
    FlowIds& ids_;
    // Flow id -> the token on_connection saw; bounded with the ids (an evicted id's entry goes).
    std::map<uint64_t, uint32_t> connected_;
};

}  // namespace mpsteer::lua
