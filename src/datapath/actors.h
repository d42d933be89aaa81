// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The userspace side of the option-rewriting actors (bpf/lib/rewrite.h and its actors): the
// announcements blk_subflow hid, add_subflow requests, and set_backup's one-shot memory. Errors are
// datapath::Error, as in datapath.h.
//
// The maps are read and written through file descriptors: those of a loaded Generation
// (ActorMaps::of) or pinned ones (ActorMaps::open), so the agent, the CLI and the tests use
// the same calls whichever owns the maps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "datapath/datapath.h"

namespace mpsteer::datapath {

// One of set_backup's packet templates (map "prio_tmpl"; struct mps_prio_tmpl in abi.h).
struct PrioTemplate {
    mps_prio_tmpl_key key{};
    mps_prio_tmpl value{};
};

// The pure ACK that follows the template's packet on its subflow (seq + payload, same ack,
// window and timestamps, same L2 header), options NOP NOP TS (when the template had
// timestamps) + NOP + MP_PRIO(backup), IP and TCP checksums complete. Empty when the
// template is not a well-formed TCP/IP header.
std::vector<uint8_t> prio_frame(const mps_prio_tmpl& t, bool backup);

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

    // B=0 (or B=1) on subflows that carry no pure ACK any more. set_backup signals by growing
    // pure ACKs; once B=1 moved the data off a subflow it is idle both ways and nothing would
    // carry a later B=0 (Linux ignores MP_PRIO with an address id, and applies MP_PRIO to the
    // subflow it arrives on, so a sibling subflow cannot carry it either). The actor keeps the
    // headers of the latest ACK of every subflow direction it sees; for each one seen by the
    // set_backup step `pc`, whose last signal differs from `backup` and which has been quiet
    // for at least `min_idle_ns`, this sends prio_frame() where that packet was going:
    //  - egress hooks: an AF_PACKET socket on that interface (the frame passes the tc egress
    //    hook, where set_backup leaves a packet that has MP_PRIO alone, and packet taps);
    //  - ingress hooks: BPF_PROG_TEST_RUN of a two-instruction XDP_PASS program with
    //    BPF_F_TEST_XDP_LIVE_FRAMES, i.e. handed to the local stack as received on it;
    // and records the signal in prio_sent, so the datapath does not signal it again.
    // Sockets and ifindexes are those of the calling thread's network namespace (the one the
    // generation is attached in). Returns the number of frames sent; throws on a send error.
    // Needs the template map: ActorMaps::of(Generation) (not yet pinned with StateMaps).
    int signal_prio(uint16_t pc, bool backup, uint64_t min_idle_ns = 0);
    std::vector<PrioTemplate> prio_templates() const;
    // Sends one frame as signal_prio does for that template (no prio_sent update).
    void send_prio(const PrioTemplate& t, bool backup) const;

private:
    Fd announces_, requests_, prio_, tmpl_;  // tmpl_ may be empty
};

}  // namespace mpsteer::datapath
