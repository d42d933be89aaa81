// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The balancer's datapath (bpf/lb.bpf.c) from the agent's side: loads it, owns its maps as
// their one writer, turns the services and backends it is given into the VIP map, the backend
// array and a Maglev table (filled in the idle half, then switched), and learns tokens: each
// server key the datapath saw on a third ACK becomes token -> backend (RFC 8684: the most
// significant 32 bits of SHA-256 of the key).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lb/maglev.h"
#include "mpsteer/lb.h"

struct mps_lb;
struct ring_buffer;

namespace mpsteer::lb {

using Mac = std::array<uint8_t, 6>;

// A service: a VIP (family 4 or 6, the address in network order, IPv4 in the first 4 bytes)
// and a TCP port.
struct Service {
    uint8_t family = 4;
    std::array<uint8_t, 16> addr{};
    uint16_t port = 0;
    mps_lb_unknown_action unknown_token = MPS_LB_UNKNOWN_DROP;
};

// A backend: its Maglev identity (name, weight, draining) and where its frames go.
struct Target {
    Backend backend;
    Mac mac{};      // the backend's
    Mac src_mac{};  // the balancer's, on `ifindex`
    uint32_t ifindex = 0;
};

struct Sizes {
    uint32_t flows = 65536;   // subflows followed (LRU)
    uint32_t tokens = 65536;  // tokens owned (LRU)
    uint32_t table = kDefaultTableSize;
};

using Counters = std::array<uint64_t, MPS_LB_C_MAX>;
// A counter's name in status and metrics ("joins_routed"): its enum name, lower-case.
const char* counter_name(uint32_t counter);

class Balancer {
public:
    // Loads the datapath (not attached). Throws std::runtime_error naming what failed. With
    // `pin_dir`, its maps are pinned there, and the ones an earlier balancer pinned there are
    // taken over when their sizes are the same (reused()): its subflows, tokens, backends,
    // tables and counters go on. The backends' indices by name are the caller's to keep
    // (backend_indices) and give back (restore_backend_indices).
    explicit Balancer(const Sizes& sizes = {}, const std::string& pin_dir = "");
    bool reused() const { return reused_; }
    const std::map<std::string, uint32_t>& backend_indices() const { return index_; }
    void restore_backend_indices(std::map<std::string, uint32_t> index);
    ~Balancer();
    Balancer(const Balancer&) = delete;
    Balancer& operator=(const Balancer&) = delete;

    int prog_fd() const;
    // XDP_PASS and nothing else: what the veth peer of a backend's interface must run for the
    // veth to take redirected frames (test beds; a NIC needs none).
    int veth_peer_prog_fd() const;

    // Replaces the services. Throws std::invalid_argument for more than MPS_LB_MAX_VIPS, a
    // family other than 4 or 6, or one service twice.
    void set_services(const std::vector<Service>& services);

    // Replaces the backends. A backend keeps its index (the flows and tokens that name it) for
    // as long as its name stays in the list; one that leaves it stops forwarding. Throws
    // std::invalid_argument (maglev_table's reasons, or more than MPS_LB_MAX_BACKENDS names
    // over the balancer's life without a free index).
    void set_backends(const std::vector<Target>& targets);

    // The index the datapath knows a backend by; -1 when it has none.
    int index_of(const std::string& name) const;

    // Takes the server keys the datapath reported and owns their tokens; waits up to
    // `timeout` for the first. Returns how many tokens were written. May run on a thread of its
    // own beside the other calls: it writes only the token table.
    size_t learn(std::chrono::milliseconds timeout);

    // A token owned by a backend (learnt here, or announced by the backend).
    void own_token(uint32_t token, uint32_t backend_index);
    // The backend owning a token, -1 when none.
    int owner_of(uint32_t token) const;

    Counters counters() const;  // summed over the CPUs

private:
    static int on_learn(void* self, void* data, size_t size);

    struct SkelDeleter {
        void operator()(mps_lb* s) const;
    };
    std::unique_ptr<mps_lb, SkelDeleter> skel_;
    ring_buffer* rb_ = nullptr;
    uint32_t table_size_;
    uint32_t active_ = 0;
    std::map<std::string, uint32_t> index_;  // backend name -> its index in lb_backends
    size_t learnt_ = 0;
    bool reused_ = false;
};

}  // namespace mpsteer::lb
