// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Helpers for the option-rewriting actors' end-to-end tests: packet captures checked with
// tshark, an MPTCP connect with a deadline, per-subflow MPTCP flags and byte counters from
// `ss`, and a three-namespace topology (client, middle host with two uplinks, server) built
// on the Lab's public helpers. Names start with the Lab prefix ("mps-"), so Lab::cleanup
// removes leftovers by name.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "lab/lab.h"

namespace mpsteer::e2e {

// `tshark -i <ifname> -f <filter>` inside a namespace, writing a pcapng file; the file is
// removed when the object goes (kept with MPS_KEEP_PCAP=1). The default capture filter keeps
// the control packets (every rewritten packet is one) and leaves out full-size data segments.
class Capture {
public:
    Capture(const std::string& netns, const std::string& ifname,
            const std::string& filter = "tcp and less 200");
    ~Capture();
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;
    void stop();  // idempotent
    // Packets matching a display filter, dissected with TCP and IP checksum validation on.
    int count(const std::string& filter);
    // Malformed packets (any expert item of the malformed group, e.g. a bad option length) and
    // bad IP checksums, and with `checksums` bad TCP checksums (captured without checksum
    // offload: Offloads::strict), one line each; empty when there are none.
    std::string problems(bool checksums);
    const std::string& path() const { return path_; }

private:
    std::string path_;
    pid_t pid_ = -1;
};

// An MPTCP connection attempt from `netns` that gives up after `timeout`: 0 when connected,
// else the error (ETIMEDOUT when it gave up, ECONNREFUSED for a reset).
int connect_error(const std::string& netns, const std::string& addr, uint16_t port,
                  std::chrono::milliseconds timeout);
inline bool try_connect(const std::string& netns, const std::string& addr, uint16_t port,
                        std::chrono::milliseconds timeout) {
    return connect_error(netns, addr, port, timeout) == 0;
}

// One TCP subflow as `ss -tni` shows it: the MPTCP subflow flags (ss prints them after
// "tcp-ulp-mptcp flags:", e.g. "Mec"; B = the peer asked for backup) and the byte counters.
struct SubflowState {
    std::string local, remote, flags;
    uint64_t bytes_acked = 0, bytes_received = 0;
};
std::vector<SubflowState> subflow_states(const std::string& netns);

// client (one interface, two addresses) -- middle (forwards; two uplinks) == server (a service
// address reachable through either uplink; the middle routes it through uplink 1).
//   <P>-cli  <P>-cm  10.20.0.1/24 + 10.20.0.3/24 (MPTCP "subflow" endpoint), default via .2
//   <P>-mid  <P>-mc  10.20.0.2/24; <P>-u1 10.21.0.1/24; <P>-u2 10.22.0.1/24
//            10.29.0.2 via 10.21.0.2 (u1, metric 10) and via 10.22.0.2 (u2, metric 20)
//   <P>-srv  <P>-v1  10.21.0.2/24; <P>-v2 10.22.0.2/24; 10.29.0.2/32 on lo;
//            10.20.0.0/24 via 10.21.0.1
class MiddleTopology {
public:
    explicit MiddleTopology(const std::string& tag,  // P = "mps-" + tag
                            lab::Offloads offloads = lab::Offloads::host);
    ~MiddleTopology();
    MiddleTopology(const MiddleTopology&) = delete;
    MiddleTopology& operator=(const MiddleTopology&) = delete;
    std::string ns(const char* role) const { return prefix_ + "-" + role; }   // cli, mid, srv
    std::string dev(const char* name) const { return prefix_ + "-" + name; }  // cm, mc, u1 ...
    static constexpr const char* kService = "10.29.0.2";
    static constexpr const char* kClient1 = "10.20.0.1";
    static constexpr const char* kClient2 = "10.20.0.3";

private:
    std::string prefix_;
};

}  // namespace mpsteer::e2e
