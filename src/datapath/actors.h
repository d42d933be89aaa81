// The userspace side of the option-rewriting actors (bpf/rewrite.bpf.h): the announcements
// blk_subflow hid, add_subflow requests, and set_backup's one-shot memory. Errors are
// datapath::Error, as in datapath.h.
//
// The maps are read and written through file descriptors: those of a loaded Generation
// (ActorMaps::of) or pinned ones (ActorMaps::open), so the agent, the CLI and the tests use
// the same calls whichever owns the maps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "datapath/datapath.h"

namespace mpsteer::datapath {

struct Announcement {
    mps_announce_key key{};
    mps_announce value{};
    // "10.0.2.2", "10.0.2.2:8080", "fd00:2::2", "[fd00:2::2]:8080"
    std::string address() const;
    bool released() const { return value.state == MPS_ANN_RELEASED; }
};

std::string_view to_string(mps_announce_state s);  // "blocked", "pending", ...

class ActorMaps {
public:
    // The shared maps every generation uses (they survive generations and restarts).
    static ActorMaps of(const StateMaps& s);
    // The maps a generation uses (the shared ones, since generations reuse them).
    static ActorMaps of(const Generation& g);
    // Pinned maps, e.g. <pin_root>/maps/announces_v<MPS_STATE_LAYOUT> (see abi.h).
    static ActorMaps open(const std::string& announces, const std::string& add_requests,
                          const std::string& prio_sent);

    // Every stored announcement, oldest first.
    std::vector<Announcement> announcements() const;
    std::optional<Announcement> find(const mps_announce_key& k) const;

    // add_subflow: marks the announcement pending and queues the request; the next packet
    // of its flow, travelling the way the announcement did, through an add_subflow step on a
    // TC hook delivers the stored option to the host. Returns false when the announcement
    // was already released; throws when it is unknown.
    bool request_add_subflow(const mps_announce_key& k);
    // Hide it again from now on (a released announcement's retransmissions are hidden too).
    void block_again(const mps_announce_key& k);

    // set_backup's memory for a subflow (nullopt: nothing signalled yet), and forgetting it
    // so a one-shot set_backup signals again.
    std::optional<mps_prio_sent> prio_sent(const mps_flow_key& k) const;
    void forget_prio(const mps_flow_key& k);

private:
    Fd announces_, requests_, prio_;
};

}  // namespace mpsteer::datapath
