// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A small packet builder for the datapath tests: Ethernet (+ 802.1Q / 802.1ad tags), IPv4 (with
// options and settable ihl / fragment fields), IPv6 (with hop-by-hop, routing and destination
// options headers), TCP with arbitrary option bytes, and helpers for every MPTCP option.
//
// By default everything is consistent: lengths derived from the contents, the IPv4 header
// checksum and the TCP checksum (pseudo-header, v4 and v6) computed. Every length and checksum
// can be overridden, and the finished frame can be truncated, to build malformed input.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mpsteer::test {

using Bytes = std::vector<uint8_t>;

// ---- addresses ----------------------------------------------------------------------------

using Ip4 = std::array<uint8_t, 4>;
using Ip6 = std::array<uint8_t, 16>;
Ip4 ip4(std::string_view text);  // "10.0.0.1"; throws std::invalid_argument
Ip6 ip6(std::string_view text);  // "2001:db8::1"

// ---- TCP options (each returns the option's bytes) ----------------------------------------

namespace opt {
Bytes nop();
Bytes eol();
Bytes mss(uint16_t mss);
Bytes wscale(uint8_t shift);
Bytes sack_perm();
Bytes timestamps(uint32_t tsval, uint32_t tsecr);
// Any option: kind, then the length byte (2 + body unless `len` overrides it), then the body.
Bytes raw(uint8_t kind, const Bytes& body, std::optional<uint8_t> len = std::nullopt);
}  // namespace opt

// MPTCP options (RFC 8684 §3). 64-bit values are given as numbers and written big-endian.
namespace mptcp {
// MP_CAPABLE: length 4 (v1 SYN), 12 (sender's key), 20 (both keys), 22 (+ data-level length),
// 24 (+ DSS checksum). `flags` is the A..H byte (0x01 = H, HMAC-SHA256).
struct Capable {
    uint8_t version = 1;
    uint8_t flags = 0x01;
    std::optional<uint64_t> sender_key;
    std::optional<uint64_t> receiver_key;
    std::optional<uint16_t> data_len;
    std::optional<uint16_t> checksum;
};
Bytes capable(const Capable& c);
Bytes capable_syn(uint8_t version = 1, uint8_t flags = 0x01);                         // length 4
Bytes capable_synack(uint64_t key, uint8_t flags = 0x01);                             // length 12
Bytes capable_ack(uint64_t sender_key, uint64_t receiver_key, uint8_t flags = 0x01);  // 20

// MP_JOIN: SYN (12), SYN/ACK (16, 64-bit truncated HMAC), third ACK (24, 160-bit HMAC).
Bytes join_syn(uint32_t token, uint32_t nonce, uint8_t addr_id = 1, bool backup = false);
Bytes join_synack(uint64_t hmac, uint32_t nonce, uint8_t addr_id = 1, bool backup = false);
Bytes join_ack(const std::array<uint8_t, 20>& hmac);

// DSS: flags F m M a A from the fields present. Data ACK and DSN are 4 or 8 bytes.
struct Dss {
    std::optional<uint64_t> data_ack;
    bool ack8 = true;
    std::optional<uint64_t> dsn;  // present: a mapping (DSN, subflow seq, data-level length)
    bool dsn8 = true;
    uint32_t ssn = 0;
    uint16_t data_len = 0;
    std::optional<uint16_t> checksum;
    bool fin_ = false;

    Dss& ack(uint64_t v, bool eight = true) {
        data_ack = v;
        ack8 = eight;
        return *this;
    }
    Dss& map(uint64_t d, uint32_t s, uint16_t len, bool eight = true) {
        dsn = d;
        ssn = s;
        data_len = len;
        dsn8 = eight;
        return *this;
    }
    Dss& csum(uint16_t c) {
        checksum = c;
        return *this;
    }
    Dss& fin() {
        fin_ = true;
        return *this;
    }
};
Bytes dss(const Dss& d);

// ADD_ADDR: IPv4 or IPv6, optional port, echo (E=1: no HMAC) or an 8-byte HMAC.
Bytes add_addr(const Ip4& a, uint8_t addr_id, std::optional<uint16_t> port = std::nullopt,
               bool echo = false, uint64_t hmac = 0);
Bytes add_addr(const Ip6& a, uint8_t addr_id, std::optional<uint16_t> port = std::nullopt,
               bool echo = false, uint64_t hmac = 0);
Bytes remove_addr(const std::vector<uint8_t>& ids);
Bytes mp_prio(bool backup);                   // v1: length 3
Bytes mp_prio_v0(bool backup, uint8_t id);    // RFC 6824: length 4 with an address id
Bytes mp_fail(uint64_t dsn);                  // length 12
Bytes fastclose(uint64_t receiver_key);       // length 12
Bytes tcprst(uint8_t flags, uint8_t reason);  // length 4
}  // namespace mptcp

// ---- headers ------------------------------------------------------------------------------

struct Vlan {
    uint16_t tpid = 0x8100;  // 0x8100 (802.1Q) or 0x88a8 (802.1ad)
    uint16_t tci = 0;
};

struct Eth {
    std::array<uint8_t, 6> dst{0x02, 0, 0, 0, 0, 0x02};
    std::array<uint8_t, 6> src{0x02, 0, 0, 0, 0, 0x01};
    std::vector<Vlan> vlans;            // outermost first
    std::optional<uint16_t> ethertype;  // default from the IP version
};

struct Ipv4 {
    Ip4 src{}, dst{};
    uint8_t tos = 0;
    uint16_t id = 0x1234;
    uint16_t frag = 0x4000;  // flags (DF 0x4000, MF 0x2000) | offset in 8-byte units
    uint8_t ttl = 64;
    uint8_t protocol = 6;
    Bytes options;                   // padded with EOL to a multiple of 4
    std::optional<uint8_t> version;  // overrides
    std::optional<uint8_t> ihl;
    std::optional<uint16_t> tot_len;
    std::optional<uint16_t> checksum;
};

// An IPv6 extension header: type (0 hop-by-hop, 43 routing, 60 destination options, 44
// fragment) and its body after the two bytes {next header, length}; the body is padded with
// zeros to make the header a multiple of 8 bytes (fragment headers are 8 bytes long).
struct Ext6 {
    uint8_t type = 0;
    Bytes body;
    std::optional<uint8_t> hdr_len;  // overrides the length byte
};
Ext6 hop_by_hop(Bytes tlvs = {});  // PadN-filled when empty
Ext6 dest_opts(Bytes tlvs = {});
Ext6 routing(uint8_t routing_type = 0, uint8_t segments_left = 0, std::vector<Ip6> addrs = {});
Ext6 fragment6(uint16_t offset, bool more, uint32_t ident = 1);

struct Ipv6 {
    Ip6 src{}, dst{};
    uint8_t tclass = 0;
    uint32_t flow = 0;
    uint8_t hop_limit = 64;
    std::vector<Ext6> ext;
    std::optional<uint8_t> next;  // overrides the upper-layer protocol (default 6)
    std::optional<uint16_t> payload_len;
};

namespace tcpf {
constexpr uint8_t FIN = 0x01, SYN = 0x02, RST = 0x04, PSH = 0x08, ACK = 0x10, URG = 0x20;
}

struct Tcp {
    uint16_t sport = 0, dport = 0;
    uint32_t seq = 1000, ack = 0;
    uint8_t flags = tcpf::ACK;
    uint16_t window = 0xffff;
    uint16_t urg = 0;
    Bytes options;  // padded with EOL to a multiple of 4
    Bytes payload;
    std::optional<uint8_t> doff;  // overrides
    std::optional<uint16_t> checksum;
};

// A whole frame. Build with the helpers below and the chainable setters.
struct Packet {
    Eth eth;
    std::variant<Ipv4, Ipv6> ip;
    Tcp tcp;
    std::optional<size_t> truncate;  // cut the finished frame to this many bytes
    Bytes trailer;                   // bytes after the IP packet (Ethernet padding)

    static Packet v4(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport);
    static Packet v6(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport);

    Packet& flags(uint8_t f) {
        tcp.flags = f;
        return *this;
    }
    Packet& seq(uint32_t s) {
        tcp.seq = s;
        return *this;
    }
    Packet& ack(uint32_t a) {
        tcp.ack = a;
        return *this;
    }
    Packet& window(uint16_t w) {
        tcp.window = w;
        return *this;
    }
    Packet& option(const Bytes& o);  // appends to the TCP options
    Packet& payload(size_t n, uint8_t fill = 0xab);
    Packet& vlan(uint16_t tpid, uint16_t tci) {
        eth.vlans.push_back({tpid, tci});
        return *this;
    }
    Ipv4& v4h() { return std::get<Ipv4>(ip); }
    Ipv6& v6h() { return std::get<Ipv6>(ip); }
    bool is_v6() const { return std::holds_alternative<Ipv6>(ip); }
    // The same 4-tuple in the other direction (addresses and ports swapped, options cleared).
    Packet reversed() const;

    Bytes build() const;
};

// ---- checksums ----------------------------------------------------------------------------

// RFC 1071 sum of `data` added to `acc`, not folded.
uint32_t csum_add(uint32_t acc, std::span<const uint8_t> data);
uint16_t csum_fold(uint32_t acc);  // ~(folded sum)

struct Located {
    size_t l3 = 0;      // offset of the IP header
    size_t l4 = 0;      // offset of the TCP header
    size_t l4_len = 0;  // TCP header + payload bytes according to the IP header
    int family = 0;     // 4 or 6
};
// Finds the IP and TCP headers of a frame built like the above; nullopt when it is not a
// complete TCP-over-IP frame.
std::optional<Located> locate(std::span<const uint8_t> frame);

// Recomputes both checksums of a frame (IPv4 header, TCP with its pseudo-header). Empty string:
// both verify; otherwise what is wrong.
std::string checksum_errors(std::span<const uint8_t> frame);
inline bool verify_checksums(std::span<const uint8_t> frame) {
    return checksum_errors(frame).empty();
}

// Hex dump with offsets, for failure messages; marks bytes that differ from `other`.
std::string hexdump(std::span<const uint8_t> b, std::span<const uint8_t> other = {});

// Big-endian helpers.
void put16(Bytes& b, uint16_t v);
void put32(Bytes& b, uint32_t v);
void put64(Bytes& b, uint64_t v);
uint16_t get16(std::span<const uint8_t> b, size_t off);
uint32_t get32(std::span<const uint8_t> b, size_t off);

}  // namespace mpsteer::test
