// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Events (EventReader): the ring buffer's records, with MP_CAPABLE keys turned into tokens
// and IDSNs (mptcp_key_ids) and written back to the flow and connection maps, so the `token`
// selector finds the connection; each event carries its flow entry on to the handler.
#include "datapath/internal.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "net/address.h"
#include "net/sha256.h"

namespace mpsteer::datapath {

using detail::fail;

namespace {
std::atomic<uint64_t> conn_insert_count{0};
}

uint64_t conn_inserts() {
    return conn_insert_count.load(std::memory_order_acquire);
}

MptcpKeyIds mptcp_key_ids(uint64_t key_wire) {
    // The key as on the wire is already big-endian bytes in memory. One digest gives both.
    const auto h = net::sha256(&key_wire, sizeof key_wire);
    MptcpKeyIds ids;
    ids.token = uint32_t(h[0]) << 24 | uint32_t(h[1]) << 16 | uint32_t(h[2]) << 8 | h[3];
    for (int i = 24; i < 32; ++i) ids.idsn = ids.idsn << 8 | h[i];
    return ids;
}

namespace {
// What ctl_flow_update (bpf/ctl.bpf.c) has just written into the flow entry, applied to the
// reader's copy of it, so the copy handed on with the event is the entry as it is now.
void mirror_update(mps_flow& f, const mps_ctl_flow_req& r) {
    for (int i = 0; i < 2; ++i) {
        if ((r.set & MPS_CTL_TOKENS) && r.token[i]) f.token[i] = r.token[i];
        if ((r.set & MPS_CTL_IDSN) && r.idsn[i]) f.idsn[i] = r.idsn[i];
    }
    if (r.set & MPS_CTL_CONN) f.conn_token = r.conn_token;
}
}  // namespace

EventReader::EventReader(const StateMaps& state, Handler handler)
    : state_(state), handler_(std::move(handler)) {
    rb_ = ring_buffer__new(state.events(), &EventReader::on_sample, this, nullptr);
    if (!rb_) fail("opening the event ring buffer", errno);
}

EventReader::~EventReader() {
    ring_buffer__free(rb_);
}

int EventReader::fd() const {
    return ring_buffer__epoll_fd(rb_);
}

int EventReader::poll(std::chrono::milliseconds timeout) {
    int n = ring_buffer__poll(rb_, static_cast<int>(timeout.count()));
    if (n < 0 && n != -EINTR) fail("polling events", n);
    return n < 0 ? 0 : n;
}

int EventReader::consume() {
    int n = ring_buffer__consume(rb_);
    if (n < 0) fail("consuming events", n);
    return n;
}

// Tokens from keys: write them where the datapath looks (flow fields through the control
// program, a connection entry created once), never rewriting what the datapath counts.
int EventReader::on_sample(void* self_ptr, void* data, size_t size) {
    auto* self = static_cast<EventReader*>(self_ptr);
    if (size < sizeof(mps_event)) return 0;
    Event ev{};
    std::memcpy(&ev.raw, data, sizeof ev.raw);
    const auto& r = ev.raw;
    const auto& state = self->state_;
    mps_flow& f = ev.flow;
    ev.have_flow = bpf_map_lookup_elem(state.flows(), &r.flow, &f) == 0;
    const bool have_flow = ev.have_flow;
    mps_ctl_flow_req req{};
    req.key = r.flow;
    if (r.type == MPS_EV_MP_CAPABLE) {
        // key[0] is the sender's key, key[1] (third ACK only) the receiver's.
        const int sender = r.from_a ? 0 : 1;
        uint64_t keys[2] = {0, 0};
        keys[sender] = r.key[0];
        keys[sender ^ 1] = r.key[1];
        for (int i = 0; i < 2; ++i)  // keys may have arrived in separate packets
            if (!keys[i] && have_flow) keys[i] = f.key[i];
        uint32_t tok[2] = {0, 0};
        for (int i = 0; i < 2; ++i) {
            if (!keys[i]) continue;
            const auto ids = mptcp_key_ids(keys[i]);
            tok[i] = ids.token;
            req.token[i] = ids.token;
            req.idsn[i] = ids.idsn;
        }
        ev.token_a = tok[0];
        ev.token_b = tok[1];
        req.set = MPS_CTL_TOKENS | MPS_CTL_IDSN;
        if (tok[0] && tok[1]) {
            mps_conn c{};
            c.token[0] = std::min(tok[0], tok[1]);
            c.token[1] = std::max(tok[0], tok[1]);
            c.subflows = 1;  // its counters start at zero: a linked flow hands over all it counted
            if (bpf_map_update_elem(state.conns(), &c.token[0], &c, BPF_NOEXIST) == 0)
                conn_insert_count.fetch_add(1, std::memory_order_release);
            mps_conn alias{};
            alias.token[0] = c.token[0];
            alias.token[1] = c.token[1];
            bpf_map_update_elem(state.conns(), &c.token[1], &alias, BPF_NOEXIST);
            req.conn_token = c.token[0];
            req.set |= MPS_CTL_CONN;
        }
        if (have_flow) {
            ev.have_flow = state.update_flow(req);  // false: the entry went meanwhile
            if (ev.have_flow) mirror_update(f, req);
        }
    } else if (r.type == MPS_EV_MP_JOIN && have_flow) {
        // The token names the receiver's side; the connection entry gives the other one.
        mps_conn c{};
        bool found = bpf_map_lookup_elem(state.conns(), &r.token, &c) == 0;
        if (found) {
            const int receiver = r.from_a ? 1 : 0;
            req.token[receiver] = r.token;
            req.token[receiver ^ 1] = c.token[0] == r.token ? c.token[1] : c.token[0];
            req.conn_token = c.token[0];
            req.set = MPS_CTL_TOKENS | MPS_CTL_CONN;
            // The datapath counts the subflow itself when the connection entry existed at
            // the MP_JOIN SYN (then it linked the flow already); otherwise count it here.
            if (f.conn_token != c.token[0]) req.set |= MPS_CTL_SUBFLOW;
            ev.have_flow = state.update_flow(req);
            if (ev.have_flow) mirror_update(f, req);
        }
    }
    self->handler_(ev);
    return 0;
}

EventFields decode(const mps_event& e) {
    EventFields f;
    switch (e.type) {
    case MPS_EV_MP_CAPABLE: f.type = "mp_capable"; break;
    case MPS_EV_MP_JOIN:
        f.type = "mp_join";
        f.backup = e.flags & 1;
        break;
    case MPS_EV_FLOW_CLOSED:
        f.type = "flow_closed";
        f.reset = e.flags & 1;
        break;
    case MPS_EV_ADD_ADDR_BLOCKED:
        f.type = "add_addr_blocked";
        f.address = net::address_text(e.flags == 6 ? 6 : 4, e.key);
        f.port = uint16_t(e.nonce);
        break;
    default: f.type = "unknown"; break;
    }
    return f;
}

}  // namespace mpsteer::datapath
