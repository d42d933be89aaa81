// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The namespace test bed: a client and a server network namespace joined by two veth pairs,
// kernel MPTCP between them, a small MPTCP sender/sink, and the kernel's own view of the
// connections (MPTCP netlink events, MPTCP_INFO). Used by the e2e tests and `mpsteer demo`;
// LoadBalancerLab and TenantLab (below) are test beds `mpsteer usecases` runs.
//
// Layout of a Lab with prefix P = "mps-<tag>" (path n = 1, 2):
//   namespaces  P-cli, P-srv
//   veth pair   P-c<n> (in P-cli, 10.0.<n>.1/24, fd00:<n>::1/64)
//          <->  P-s<n> (in P-srv, 10.0.<n>.2/24, fd00:<n>::2/64)
//   delay       a path with delay_ms > 0 runs through a third namespace P-dly instead:
//               P-c<n> <-> P-dc<n> [delay line] P-ds<n> <-> P-s<n> (same addresses; the
//               relay is L2, so the two ends still see each other directly)
//   MPTCP       limits subflows 2 / add_addr_accepted 2 on both sides; the server signals
//               10.0.2.2 (endpoint id 1), so a client connecting to 10.0.1.2 opens a second
//               subflow 10.0.2.1 -> 10.0.2.2.
// Everything the Lab creates lives inside its two namespaces and carries the prefix, so
// deleting the namespaces by name removes it all (Lab::cleanup does that for leftovers).
// Errors are exceptions (lab::Error) with the failing command and its output.
#pragma once

#include <atomic>
#include <functional>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "datapath/datapath.h"
#include "net/fd.h"

namespace mpsteer::lab {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---- commands ------------------------------------------------------------------------------

struct CmdResult {
    int status = 0;   // exit code; 128 + signal when killed
    std::string out;  // stdout and stderr, interleaved
};
// Runs argv (no shell) and waits. Never throws for a non-zero exit; throws if it cannot start.
CmdResult run(const std::vector<std::string>& argv);
// The same inside a namespace (`ip netns exec <netns> argv...`).
CmdResult run_in(const std::string& netns, const std::vector<std::string>& argv);
// run(), throwing Error (command line and output) on a non-zero exit. Returns the output.
std::string must(const std::vector<std::string>& argv);
std::string must_in(const std::string& netns, const std::vector<std::string>& argv);

// Moves the calling thread into /run/netns/<netns> and back on destruction. Only this thread
// changes namespace; sockets created meanwhile stay in <netns> for their whole life, and
// name-based calls (if_nametoindex, HookLink::attach) resolve there.
class NetnsGuard {
public:
    explicit NetnsGuard(const std::string& netns);
    ~NetnsGuard();
    NetnsGuard(const NetnsGuard&) = delete;
    NetnsGuard& operator=(const NetnsGuard&) = delete;

private:
    net::Fd saved_;
};

// ---- the lab -------------------------------------------------------------------------------

// How a path behaves. This kernel has no sch_netem, so the delay is a user-space delay line
// (fixed when the Lab is built) and the rate a tbf qdisc on both ends (changeable).
struct PathShape {
    unsigned delay_ms = 0;   // each direction: RTT = 2 x delay_ms
    unsigned rate_kbit = 0;  // 0: no rate limit
};

// Holds every frame between two interfaces of a namespace for a fixed time (both ways).
class DelayLine {
public:
    DelayLine(const std::string& netns, const std::string& if_a, const std::string& if_b,
              std::chrono::microseconds delay);
    ~DelayLine();
    DelayLine(const DelayLine&) = delete;
    DelayLine& operator=(const DelayLine&) = delete;
    void set_delay(std::chrono::microseconds d) { delay_us_ = d.count(); }
    // Drops every frame from now on (both ways, silently: a path that fails in the network
    // with its links up), or relays again.
    void set_blackhole(bool on) { blackhole_ = on; }
    uint64_t dropped() const { return dropped_.load(); }

private:
    void relay();
    net::Fd fd_[2];
    std::atomic<int64_t> delay_us_;
    std::atomic<bool> blackhole_{false};
    std::atomic<uint64_t> dropped_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// How a test bed's veths offload.
//   host:   as a host has them by default: checksum offload, TSO and GSO on, GRO on receive.
//           Programs at TC egress see partial checksums (the pseudo-header's sum) and GSO
//           super-packets, at TC ingress GRO aggregates; a receiving stack trusts a segment
//           that left its sender with a partial checksum.
//   strict: none: every checksum is computed in full by the sender and verified by the
//           receiving stack, so one an actor breaks shows in TcpInCsumErrors (tcp_counters()).
enum class Offloads { host, strict };
const char* to_string(Offloads o);
// Applies `o` to `dev` inside `netns`.
void set_offloads(const std::string& netns, const std::string& dev, Offloads o);

struct LabConfig {
    std::string tag;     // empty: "p<pid>"; at most 7 characters (interface names hold 15)
    PathShape path[2];   // path 1, path 2
    bool ipv6 = true;    // also fd00:<n>::/64 on each path
    bool signal = true;  // server announces its path-2 address (ADD_ADDR)
    Offloads offloads = Offloads::host;  // every interface, the delay line's too
};

class Lab {
public:
    static constexpr const char* kPrefix = "mps-";

    explicit Lab(LabConfig cfg = {});  // removes leftovers with the same prefix first
    ~Lab();                            // deletes every namespace and link it made
    Lab(const Lab&) = delete;
    Lab& operator=(const Lab&) = delete;

    // Deletes every namespace and root-namespace link whose name starts with `prefix`
    // (e.g. "mps-" for all leftovers, "mps-t123" for one lab). Returns how many it removed.
    static int cleanup(const std::string& prefix);
    // Removes the labs of processes that are gone (each Lab keeps its owner's pid in
    // /run/mpsteer-lab/<prefix>). Labs of running processes, and namespaces no Lab made,
    // are left alone.
    static int cleanup_stale();
    // Throws Error naming every command the test beds run that is not installed (ip, tc, ss,
    // sysctl, ethtool) and the Debian package that provides it: a minimal root may lack them.
    static void require_tools();
    // Records this process as the owner of `prefix` (what cleanup_stale() reads), before
    // anything with that prefix exists; release() forgets it. Other test beds use these too.
    static void claim(const std::string& prefix);
    static void release(const std::string& prefix);

    const std::string& prefix() const { return prefix_; }
    std::string client_ns() const { return prefix_ + "-cli"; }
    std::string server_ns() const { return prefix_ + "-srv"; }
    std::string delay_ns() const { return prefix_ + "-dly"; }
    std::string client_if(int path) const;  // path 1 or 2
    std::string server_if(int path) const;
    static std::string client_addr(int path);   // "10.0.<path>.1"
    static std::string server_addr(int path);   // "10.0.<path>.2"
    static std::string client_addr6(int path);  // "fd00:<path>::1"
    static std::string server_addr6(int path);

    // Payload bytes the client's IPv4 subflows to server_addr(path):server_port have received,
    // per path (index 0: path 1), from the kernel's sockets (`ss`: milliseconds per call).
    std::array<uint64_t, 2> client_received_per_path(uint16_t server_port) const;

    // Changes the rate (and the delay of a path built with one) while the lab runs.
    void shape(int path, PathShape s);
    // A path built with a delay silently drops everything in both directions (on) or carries
    // it again (off); its interfaces stay up.
    void blackhole(int path, bool on);
    // `ss -tniM` in a namespace, for logs and failure messages.
    std::string ss(const std::string& netns) const;

private:
    void build();
    void set_rate(int path, unsigned rate_kbit);
    std::string prefix_;
    LabConfig cfg_;
    std::unique_ptr<DelayLine> delay_[2];
};

// ---- building blocks of the test beds -----------------------------------------------------

// One end of a veth pair: its namespace, name and addresses with their prefix length (v6
// empty: IPv4 only).
struct VethEnd {
    std::string ns, dev, v4, v6;
};
// A veth pair created directly inside its two namespaces (nothing sits in the root namespace).
void veth_pair(const VethEnd& a, const VethEnd& b, Offloads o = Offloads::host);
// A token bucket on the egress of `dev` inside `netns` (sch_netem is not built here); rate 0
// removes it.
void shape_egress(const std::string& netns, const std::string& dev, unsigned rate_kbit);

// Interface counters read inside a namespace (/proc/thread-self/net/dev).
struct LinkCounters {
    uint64_t rx_bytes = 0, rx_packets = 0, tx_bytes = 0, tx_packets = 0;
};
LinkCounters link_counters(const std::string& netns, const std::string& ifname);

// The kernel's MPTCP MIB counters inside a namespace (the MPTcpExt line of
// /proc/net/netstat, as `nstat` shows them without the prefix: "MPJoinSynRx", ...).
std::map<std::string, uint64_t> mptcp_counters(const std::string& netns);
// The kernel's TCP MIB counters inside a namespace (the Tcp line of /proc/net/snmp:
// "InCsumErrors", "RetransSegs", ...).
std::map<std::string, uint64_t> tcp_counters(const std::string& netns);

// ---- a load-balanced service ---------------------------------------------------------------

// Servers behind a stateless load balancer (Duchene & Bonaventure, ICNP 2017): a router
// spreads a virtual address (VIP) over two backends by an L4 hash, each backend holds the VIP
// and a unique address it announces (ADD_ADDR), and a client with two paths opens MPTCP
// connections to the VIP; its in-kernel path manager adds a subflow from its second address.
// The VIP and backend 1's unique address are those the shipped load-balancer policies name.
// Layout with prefix P = "mps-<tag>" (client path n = 1, 2; backend b = 1 .. backends):
//   P-cli  P-c<n> 10.0.<n>.1/24, fd00:0:<n>::1/64; default route via path 1, traffic from
//          the path-2 address leaves by P-c2 (source routing); endpoint path-2 address subflow;
//          limits subflow 2, add_addr_accepted 2
//   P-lb   P-r<n> 10.0.<n>.2/24, fd00:0:<n>::2/64; P-l<b> 10.1.<b>.1/24, fd00:1:<b>::1/64;
//          forwarding; VIP via both backends (ECMP, fib_multipath_hash_policy 1: the 5-tuple),
//          unique address b via backend b
//   P-b<b> P-v<b> 10.1.<b>.2/24, fd00:1:<b>::2/64, default via P-l<b>; VIP and unique address
//          on lo; endpoint unique address signal; limits subflow 2
// Without unique addresses a backend holds only the VIP on lo and announces nothing (what a
// balancer that routes joins by token needs).
// Removed like a Lab: by prefix on destruction, and by Lab::cleanup_stale after a crash.
class LoadBalancerLab {
public:
    static constexpr int kMaxBackends = 9;

    // tag at most 10 characters; 1..kMaxBackends backends
    explicit LoadBalancerLab(const std::string& tag, int backends = 2,
                             bool unique_addresses = true);
    ~LoadBalancerLab();
    LoadBalancerLab(const LoadBalancerLab&) = delete;
    LoadBalancerLab& operator=(const LoadBalancerLab&) = delete;

    std::string client_ns() const { return prefix_ + "-cli"; }
    std::string router_ns() const { return prefix_ + "-lb"; }
    std::string backend_ns(int backend) const { return prefix_ + "-b" + std::to_string(backend); }
    int backends() const { return backends_; }
    std::string client_if(int path) const { return prefix_ + "-c" + std::to_string(path); }
    // The router's interfaces: towards client path n (P-r<n>), towards backend b (P-l<b>);
    // the backend's own (P-v<b>, in its namespace).
    std::string router_client_if(int path) const { return prefix_ + "-r" + std::to_string(path); }
    std::string router_backend_if(int b) const { return prefix_ + "-l" + std::to_string(b); }
    std::string backend_if(int b) const { return prefix_ + "-v" + std::to_string(b); }
    // family 4 or 6
    static std::string vip(int family);  // 203.0.113.10, 2001:db8:113::10
    // 198.51.100.2<b-1>, 2001:db8:100::2<b-1>
    static std::string unique_addr(int backend, int family);
    static std::string client_addr(int path, int family);

private:
    void build();
    std::string prefix_;
    int backends_;
    bool unique_;
};

// ---- tenants behind a hypervisor -----------------------------------------------------------

// Multi-tenant spreading (eMPTCP, ICNP 2022): tenant VMs behind a hypervisor with two uplinks
// of `uplink_kbit` each (tbf on the hypervisor's side), a server behind both. Tenant a's VM has
// one address per uplink and a "subflow" endpoint on the second, so each MPTCP connection has
// two subflows; the hypervisor routes the service over both uplinks by an L4 hash (ECMP,
// fib_multipath_hash_policy 1). Tenant b's VM sends plain TCP to a second service the
// hypervisor reaches through uplink 1 only (the background traffic). The uplinks are named as
// policies/multi-tenant.yaml names them, the tenants' addresses are in its prefixes.
// Layout with prefix P = "mps-<tag>":
//   P-vm   P-t   10.1.1.1/24, 10.1.2.1/24 (tenant a), 10.2.1.1/24 (tenant b); default via
//                10.1.1.254; the background service from 10.2.1.1; endpoint 10.1.2.1 subflow
//   P-hv   P-h   10.1.1.254/24, 10.1.2.254/24, 10.2.1.254/24; eth1 10.31.1.1/24,
//                eth2 10.31.2.1/24; forwarding; service via eth1 and eth2 (ECMP), background
//                service via eth1
//   P-srv  P-s1 10.31.1.2/24, P-s2 10.31.2.2/24; both services on lo; tenants via P-s1
// Removed like a Lab: by prefix on destruction, and by Lab::cleanup_stale after a crash.
class TenantLab {
public:
    static constexpr const char* kService = "10.39.0.1";
    static constexpr const char* kBackgroundService = "10.39.0.2";
    static constexpr const char* kTenantAddr[2] = {"10.1.1.1", "10.1.2.1"};  // per uplink
    static constexpr const char* kBackgroundAddr = "10.2.1.1";               // tenant b

    TenantLab(const std::string& tag, unsigned uplink_kbit);  // tag at most 8 characters
    ~TenantLab();
    TenantLab(const TenantLab&) = delete;
    TenantLab& operator=(const TenantLab&) = delete;

    std::string vm_ns() const { return prefix_ + "-vm"; }
    std::string hypervisor_ns() const { return prefix_ + "-hv"; }
    std::string server_ns() const { return prefix_ + "-srv"; }
    static std::string uplink(int n) { return "eth" + std::to_string(n); }  // 1, 2

private:
    void build(unsigned uplink_kbit);
    std::string prefix_;
};

// ---- the kernel's view: MPTCP netlink events -----------------------------------------------

struct MptcpEvent {
    uint32_t type = 0;   // MPTCP_EVENT_* (linux/mptcp.h)
    uint32_t token = 0;  // the local connection's token, as `ip mptcp monitor` prints it
    std::string saddr, daddr;
    uint16_t sport = 0, dport = 0;
    uint8_t loc_id = 0, rem_id = 0;
};
std::string event_name(uint32_t type);  // "created", "established", "sf_established", ...
std::string to_string(const MptcpEvent& e);

// Subscribes to the mptcp_pm_events genl group inside a namespace. The subscription is in
// place when the constructor returns, so no event of a later connection is missed.
class MptcpMonitor {
public:
    explicit MptcpMonitor(const std::string& netns);
    MptcpMonitor(const MptcpMonitor&) = delete;
    MptcpMonitor& operator=(const MptcpMonitor&) = delete;
    // Waits up to `timeout` for events; returns those received (possibly none).
    std::vector<MptcpEvent> poll(std::chrono::milliseconds timeout);
    int fd() const { return fd_.get(); }

private:
    net::Fd fd_;
};

// ---- traffic -------------------------------------------------------------------------------

// What one side of a transfer saw. The checksum is a 64-bit hash of the bytes in order
// (traffic.cpp, StreamHash), so a sender's and a sink's checksums match only if every byte
// arrived intact and in order.
struct TrafficStats {
    uint64_t bytes = 0;
    uint64_t checksum = 0;
    double seconds = 0;
    uint32_t token = 0;     // this side's MPTCP token (MPTCP_INFO); 0: not MPTCP
    unsigned subflows = 0;  // additional subflows open at the end (MPTCP_INFO)
    bool fallback = false;  // the connection fell back to plain TCP
};
// Every byte the sender sent arrived, in order (same checksum), over MPTCP to the end.
inline bool arrived_intact(const TrafficStats& sent, const TrafficStats& got) {
    return got.bytes == sent.bytes && got.checksum == sent.checksum && !got.fallback;
}

// An MPTCP listener inside `netns` that accepts one connection and reads it to the end in a
// thread. Construct it before the sender starts.
class Sink {
public:
    Sink(const std::string& netns, uint16_t port, bool ipv6 = false);
    ~Sink();
    Sink(const Sink&) = delete;
    Sink& operator=(const Sink&) = delete;
    uint64_t bytes_so_far() const { return bytes_.load(); }
    // Waits until the peer closed (throws Error on timeout or a socket error).
    TrafficStats wait(std::chrono::milliseconds timeout);

private:
    void serve();
    net::Fd listen_fd_;
    std::atomic<uint64_t> bytes_{0};
    std::atomic<bool> done_{false};
    std::atomic<bool> stop_{false};
    std::string error_;
    TrafficStats result_;
    std::thread thread_;
};

struct SendOptions {
    uint64_t bytes = 0;                       // 0: no byte limit
    std::chrono::milliseconds duration{0};    // 0: no time limit
    const std::atomic<bool>* stop = nullptr;  // set to end early
    bool plain_tcp = false;                   // send_stream: TCP instead of MPTCP
    // Source: client messages to read before the stream starts (kRequestBytes each), the
    // server answering all but the last with a reply of that size, as a web server does
    // after a TLS 1.3 handshake (2: ClientHello, then Finished with the request). 0: none.
    int requests = 0;

    static SendOptions of_bytes(uint64_t n) {
        SendOptions o;
        o.bytes = n;
        return o;
    }
    static SendOptions of_time(std::chrono::milliseconds d,
                               const std::atomic<bool>* stop = nullptr) {
        SendOptions o;
        o.duration = d;
        o.stop = stop;
        return o;
    }
};
// Connects from `netns` to addr:port over MPTCP (or TCP) and sends a deterministic byte stream
// until a limit is reached, then closes. Blocks; run it in a thread to do other things meanwhile.
TrafficStats send_stream(const std::string& netns, const std::string& addr, uint16_t port,
                         const SendOptions& opt);

// The other direction (a download): a listener inside `netns` that sends the same stream to
// the one connection it accepts, and a receiver that connects from its namespace and reads to
// the end (checksum as the sink's). `progress` sees the byte count after every read.
class Source {
public:
    // ipv6: listens on both families (as Sink).
    Source(const std::string& netns, uint16_t port, const SendOptions& opt, bool ipv6 = false);
    ~Source();
    Source(const Source&) = delete;
    Source& operator=(const Source&) = delete;
    TrafficStats wait(std::chrono::milliseconds timeout);  // the sender's side
private:
    net::Fd listen_fd_;
    std::atomic<bool> done_{false};
    std::atomic<bool> stop_{false};
    std::string error_;
    TrafficStats result_;
    std::thread thread_;
};
// With `requests`, the client side of the Source's exchange before the stream: the time
// (from the connection being up) includes the exchange, the bytes and checksum are the stream's.
TrafficStats receive_stream(const std::string& netns, const std::string& addr, uint16_t port,
                            std::chrono::milliseconds timeout,
                            const std::function<void(uint64_t)>& progress = {}, int requests = 0);
// The size of every request and reply of SendOptions::requests.
constexpr size_t kRequestBytes = 256;

// An interactive stream: the client sends a kRequestBytes message every `every` and the echo
// answers each, as a remote shell or a game does. The replies' arrival times, from which a
// caller reads the stall (the longest gap between two replies).
class Echo {
public:
    // Answers the one MPTCP connection it accepts (with ipv6 both families) until it ends.
    Echo(const std::string& netns, uint16_t port, bool ipv6 = false);
    ~Echo();
    Echo(const Echo&) = delete;
    Echo& operator=(const Echo&) = delete;

private:
    net::Fd listen_fd_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};
// Connects from `netns` and exchanges messages for `duration`: a message every `every` (the
// next one waits for the last reply), then closes. Returns when each message left and its
// reply arrived; throws when the connection breaks. `fallback` tells, from MPTCP_INFO,
// whether the connection fell back to TCP.
struct Exchange {
    std::chrono::steady_clock::time_point sent, replied;
};
std::vector<Exchange> interactive_stream(const std::string& netns, const std::string& addr,
                                         uint16_t port, std::chrono::milliseconds duration,
                                         std::chrono::milliseconds every, bool* fallback);

// Many connections at once. A listener inside `netns` (any address; with ipv6 both
// families) that accepts every MPTCP connection and reads each to its end, discarding it,
// until destroyed.
class Discard {
public:
    Discard(const std::string& netns, uint16_t port, bool ipv6);
    ~Discard();
    Discard(const Discard&) = delete;
    Discard& operator=(const Discard&) = delete;
    unsigned accepted() const { return accepted_.load(); }

private:
    void serve();
    net::Fd listen_fd_;
    std::atomic<unsigned> accepted_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// `count` MPTCP connections from `netns` to addr:port, held open until destroyed.
class ConnectionSet {
public:
    ConnectionSet(const std::string& netns, const std::string& addr, uint16_t port,
                  unsigned count);  // throws Error when a connect fails
    ConnectionSet(const ConnectionSet&) = delete;
    ConnectionSet& operator=(const ConnectionSet&) = delete;

    // Writes up to `bytes` on every connection that has not failed, without blocking.
    void send_each(size_t bytes);
    struct State {
        uint16_t local_port = 0;
        unsigned subflows = 0;  // additional subflows (MPTCP_INFO)
        bool fallback = false;  // fell back to TCP
        int error = 0;          // 0, or the errno that ended it (ECONNRESET, ...)
        bool closed = false;    // the peer closed or reset it
    };
    std::vector<State> states();

private:
    std::vector<net::Fd> fds_;
    std::vector<int> errors_;
};

// ---- the datapath in the lab ---------------------------------------------------------------

// Kernel per-subflow counters (`ss -tni` inside a namespace): payload bytes the sender got
// acknowledged, independent of anything mpsteer's programs count.
struct SubflowInfo {
    std::string local, remote;  // "addr:port"
    uint64_t bytes_acked = 0, bytes_received = 0;
    // MPTCP subflow flags as ss prints them ("Mec", "Jjecv", ...; B: the peer marked the
    // subflow backup with MP_PRIO); empty for plain TCP.
    std::string mptcp_flags;
};
std::vector<SubflowInfo> tcp_subflows(const std::string& netns);

// The chains the e2e test and the demo load on the server: every packet in or out is
// recorded, MP_CAPABLE keys and MP_JOIN tokens become events, and with rate_bytes_per_sec > 0
// the ACKs the server sends on path 2 carry a window of rate x RTT (the client's sends on
// that subflow are capped). Attached to XDP and TC egress of both server interfaces.
datapath::ChainSet server_chains(const Lab& lab, uint64_t rate_bytes_per_sec);

// A generation built from `chains` and attached inside `netns`, with its shared state maps
// pinned under `pin_root`. Destruction detaches everything and removes `pin_root`.
class Steering {
public:
    Steering(const datapath::ChainSet& chains, const std::string& netns,
             const std::string& pin_root);
    ~Steering();
    Steering(const Steering&) = delete;
    Steering& operator=(const Steering&) = delete;

    // A per-process pin root under /sys/fs/bpf ("mpsteer-<what>-<pid>"); removes the roots
    // of the same kind left by processes that no longer run.
    static std::string pin_root_for(const std::string& what);

    const datapath::StateMaps& state() const { return state_; }
    datapath::Generation& generation() const { return *gen_; }
    const std::vector<std::unique_ptr<datapath::HookLink>>& links() const { return links_; }
    // Every flow in the flow map.
    std::vector<std::pair<mps_flow_key, mps_flow>> flows() const;
    std::optional<mps_conn> conn(uint32_t lower_token) const;

private:
    std::string netns_, pin_root_;
    datapath::StateMaps state_;
    std::unique_ptr<datapath::Generation> gen_;
    std::vector<std::unique_ptr<datapath::HookLink>> links_;
};

}  // namespace mpsteer::lab
