// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "packet.h"

#include <arpa/inet.h>

#include <cstdio>
#include <stdexcept>

namespace mpsteer::test {

// ---- byte helpers -------------------------------------------------------------------------

void put16(Bytes& b, uint16_t v) {
    b.push_back(uint8_t(v >> 8));
    b.push_back(uint8_t(v));
}
void put32(Bytes& b, uint32_t v) {
    put16(b, uint16_t(v >> 16));
    put16(b, uint16_t(v));
}
void put64(Bytes& b, uint64_t v) {
    put32(b, uint32_t(v >> 32));
    put32(b, uint32_t(v));
}
uint16_t get16(std::span<const uint8_t> b, size_t off) {
    return uint16_t(b[off] << 8 | b[off + 1]);
}
uint32_t get32(std::span<const uint8_t> b, size_t off) {
    return uint32_t(get16(b, off)) << 16 | get16(b, off + 2);
}

static void append(Bytes& b, std::span<const uint8_t> x) {
    b.insert(b.end(), x.begin(), x.end());
}

Ip4 ip4(std::string_view text) {
    Ip4 a{};
    if (inet_pton(AF_INET, std::string(text).c_str(), a.data()) != 1)
        throw std::invalid_argument("bad IPv4 address: " + std::string(text));
    return a;
}

Ip6 ip6(std::string_view text) {
    Ip6 a{};
    if (inet_pton(AF_INET6, std::string(text).c_str(), a.data()) != 1)
        throw std::invalid_argument("bad IPv6 address: " + std::string(text));
    return a;
}

// ---- TCP options --------------------------------------------------------------------------

namespace opt {
Bytes nop() {
    return {1};
}
Bytes eol() {
    return {0};
}
Bytes raw(uint8_t kind, const Bytes& body, std::optional<uint8_t> len) {
    Bytes b{kind, len ? *len : uint8_t(2 + body.size())};
    append(b, body);
    return b;
}
Bytes mss(uint16_t v) {
    Bytes body;
    put16(body, v);
    return raw(2, body);
}
Bytes wscale(uint8_t shift) {
    return raw(3, {shift});
}
Bytes sack_perm() {
    return raw(4, {});
}
Bytes timestamps(uint32_t tsval, uint32_t tsecr) {
    Bytes body;
    put32(body, tsval);
    put32(body, tsecr);
    return raw(8, body);
}
}  // namespace opt

namespace mptcp {
static Bytes mp(uint8_t subtype_byte, const Bytes& rest) {
    Bytes body{subtype_byte};
    append(body, rest);
    return opt::raw(30, body);
}

Bytes capable(const Capable& c) {
    Bytes rest{c.flags};
    if (c.sender_key) put64(rest, *c.sender_key);
    if (c.receiver_key) put64(rest, *c.receiver_key);
    if (c.data_len) put16(rest, *c.data_len);
    if (c.checksum) put16(rest, *c.checksum);
    return mp(uint8_t(0x00 | (c.version & 0x0f)), rest);
}
Bytes capable_syn(uint8_t version, uint8_t flags) {
    return capable({version, flags, {}, {}, {}, {}});
}
Bytes capable_synack(uint64_t key, uint8_t flags) {
    return capable({1, flags, key, {}, {}, {}});
}
Bytes capable_ack(uint64_t sender_key, uint64_t receiver_key, uint8_t flags) {
    return capable({1, flags, sender_key, receiver_key, {}, {}});
}

Bytes join_syn(uint32_t token, uint32_t nonce, uint8_t addr_id, bool backup) {
    Bytes rest{addr_id};
    put32(rest, token);
    put32(rest, nonce);
    return mp(uint8_t(0x10 | (backup ? 1 : 0)), rest);
}
Bytes join_synack(uint64_t hmac, uint32_t nonce, uint8_t addr_id, bool backup) {
    Bytes rest{addr_id};
    put64(rest, hmac);
    put32(rest, nonce);
    return mp(uint8_t(0x10 | (backup ? 1 : 0)), rest);
}
Bytes join_ack(const std::array<uint8_t, 20>& hmac) {
    Bytes rest{0};
    append(rest, hmac);
    return mp(0x10, rest);
}

Bytes dss(const Dss& d) {
    uint8_t flags = 0;
    Bytes rest{0};
    if (d.data_ack) {
        flags |= 0x01;
        if (d.ack8) {
            flags |= 0x02;
            put64(rest, *d.data_ack);
        } else {
            put32(rest, uint32_t(*d.data_ack));
        }
    }
    if (d.dsn) {
        flags |= 0x04;
        if (d.dsn8) {
            flags |= 0x08;
            put64(rest, *d.dsn);
        } else {
            put32(rest, uint32_t(*d.dsn));
        }
        put32(rest, d.ssn);
        put16(rest, d.data_len);
        if (d.checksum) put16(rest, *d.checksum);
    }
    if (d.fin_) flags |= 0x10;
    rest[0] = flags;
    return mp(0x20, rest);
}

static Bytes add_addr_any(std::span<const uint8_t> a, uint8_t id, std::optional<uint16_t> port,
                          bool echo, uint64_t hmac) {
    Bytes rest{id};
    append(rest, a);
    if (port) put16(rest, *port);
    if (!echo) put64(rest, hmac);
    return mp(uint8_t(0x30 | (echo ? 1 : 0)), rest);
}
Bytes add_addr(const Ip4& a, uint8_t id, std::optional<uint16_t> port, bool echo, uint64_t hmac) {
    return add_addr_any(a, id, port, echo, hmac);
}
Bytes add_addr(const Ip6& a, uint8_t id, std::optional<uint16_t> port, bool echo, uint64_t hmac) {
    return add_addr_any(a, id, port, echo, hmac);
}
Bytes remove_addr(const std::vector<uint8_t>& ids) {
    return mp(0x40, ids);
}
Bytes mp_prio(bool backup) {
    return mp(uint8_t(0x50 | (backup ? 1 : 0)), {});
}
Bytes mp_prio_v0(bool backup, uint8_t id) {
    return mp(uint8_t(0x50 | (backup ? 1 : 0)), {id});
}
Bytes mp_fail(uint64_t dsn) {
    Bytes rest{0};
    put64(rest, dsn);
    return mp(0x60, rest);
}
Bytes fastclose(uint64_t key) {
    Bytes rest{0};
    put64(rest, key);
    return mp(0x70, rest);
}
Bytes tcprst(uint8_t flags, uint8_t reason) {
    return mp(uint8_t(0x80 | (flags & 0x0f)), {reason});
}
}  // namespace mptcp

// ---- IPv6 extension headers -----------------------------------------------------------------

Ext6 hop_by_hop(Bytes tlvs) {
    return {0, std::move(tlvs), {}};
}
Ext6 dest_opts(Bytes tlvs) {
    return {60, std::move(tlvs), {}};
}
Ext6 routing(uint8_t type, uint8_t segments_left, std::vector<Ip6> addrs) {
    Bytes body{type, segments_left, 0, 0, 0, 0};
    for (auto& a : addrs) append(body, a);
    return {43, body, {}};
}
Ext6 fragment6(uint16_t offset, bool more, uint32_t ident) {
    Bytes body;
    put16(body, uint16_t(offset << 3 | (more ? 1 : 0)));
    put32(body, ident);
    return {44, body, {}};
}

// ---- packets --------------------------------------------------------------------------------

Packet Packet::v4(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport) {
    Packet p;
    Ipv4 h;
    h.src = ip4(src);
    h.dst = ip4(dst);
    p.ip = h;
    p.tcp.sport = sport;
    p.tcp.dport = dport;
    return p;
}

Packet Packet::v6(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport) {
    Packet p;
    Ipv6 h;
    h.src = ip6(src);
    h.dst = ip6(dst);
    p.ip = h;
    p.tcp.sport = sport;
    p.tcp.dport = dport;
    return p;
}

Packet& Packet::option(const Bytes& o) {
    append(tcp.options, o);
    return *this;
}

Packet& Packet::payload(size_t n, uint8_t fill) {
    tcp.payload.assign(n, fill);
    return *this;
}

Packet Packet::reversed() const {
    Packet r = *this;
    std::swap(r.eth.src, r.eth.dst);
    if (auto* h = std::get_if<Ipv4>(&r.ip))
        std::swap(h->src, h->dst);
    else
        std::swap(std::get<Ipv6>(r.ip).src, std::get<Ipv6>(r.ip).dst);
    std::swap(r.tcp.sport, r.tcp.dport);
    std::swap(r.tcp.seq, r.tcp.ack);
    r.tcp.flags = tcpf::ACK;
    r.tcp.options.clear();
    r.tcp.payload.clear();
    r.tcp.doff.reset();
    r.tcp.checksum.reset();
    r.truncate.reset();
    return r;
}

// Not src/datapath/inet_csum.h, on purpose: an oracle independent of the code under test.
uint32_t csum_add(uint32_t acc, std::span<const uint8_t> data) {
    uint64_t s = acc;
    size_t i = 0;
    for (; i + 1 < data.size(); i += 2) s += uint32_t(data[i]) << 8 | data[i + 1];
    if (i < data.size()) s += uint32_t(data[i]) << 8;
    while (s >> 32) s = (s & 0xffffffff) + (s >> 32);
    return uint32_t(s);
}

uint16_t csum_fold(uint32_t acc) {
    uint64_t s = acc;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return uint16_t(~s);
}

// The destination the TCP pseudo-header uses: the final one when a type 0 / 2 routing header
// still has segments left (RFC 8200 §8.1).
static std::span<const uint8_t> final_dst6(std::span<const uint8_t> dst,
                                           std::span<const uint8_t> routing_hdr) {
    if (routing_hdr.size() >= 24 && (routing_hdr[2] == 0 || routing_hdr[2] == 2) &&
        routing_hdr[3] > 0)
        return routing_hdr.subspan(routing_hdr.size() - 16, 16);
    return dst;
}

static uint32_t pseudo_sum(int family, std::span<const uint8_t> src, std::span<const uint8_t> dst,
                           uint32_t l4_len) {
    Bytes ph;
    append(ph, src);
    append(ph, dst);
    if (family == 4) {
        ph.push_back(0);
        ph.push_back(6);
        put16(ph, uint16_t(l4_len));
    } else {
        put32(ph, l4_len);
        put32(ph, 6);
    }
    return csum_add(0, ph);
}

Bytes Packet::build() const {
    // TCP
    Bytes t;
    put16(t, tcp.sport);
    put16(t, tcp.dport);
    put32(t, tcp.seq);
    put32(t, tcp.ack);
    Bytes opts = tcp.options;
    while (opts.size() % 4) opts.push_back(0);
    uint8_t doff = tcp.doff ? *tcp.doff : uint8_t((20 + opts.size()) / 4);
    t.push_back(uint8_t(doff << 4));
    t.push_back(tcp.flags);
    put16(t, tcp.window);
    put16(t, 0);  // checksum, below
    put16(t, tcp.urg);
    append(t, opts);
    append(t, tcp.payload);

    Bytes l3;
    uint16_t ethertype;
    uint32_t psum;
    if (auto* h = std::get_if<Ipv4>(&ip)) {
        ethertype = 0x0800;
        Bytes o = h->options;
        while (o.size() % 4) o.push_back(0);
        size_t hlen = 20 + o.size();
        uint8_t ihl = h->ihl ? *h->ihl : uint8_t(hlen / 4);
        l3.push_back(uint8_t((h->version ? *h->version : 4) << 4 | (ihl & 0x0f)));
        l3.push_back(h->tos);
        put16(l3, h->tot_len ? *h->tot_len : uint16_t(hlen + t.size()));
        put16(l3, h->id);
        put16(l3, h->frag);
        l3.push_back(h->ttl);
        l3.push_back(h->protocol);
        put16(l3, 0);
        append(l3, h->src);
        append(l3, h->dst);
        append(l3, o);
        uint16_t c = h->checksum ? *h->checksum : csum_fold(csum_add(0, l3));
        l3[10] = uint8_t(c >> 8);
        l3[11] = uint8_t(c);
        psum = pseudo_sum(4, h->src, h->dst, uint32_t(t.size()));
    } else {
        const auto& h6 = std::get<Ipv6>(ip);
        ethertype = 0x86dd;
        Bytes ext;
        std::span<const uint8_t> dst = h6.dst;
        Bytes routing_copy;
        uint8_t upper = h6.next ? *h6.next : 6;
        for (size_t i = 0; i < h6.ext.size(); i++) {
            const Ext6& e = h6.ext[i];
            uint8_t next = i + 1 < h6.ext.size() ? h6.ext[i + 1].type : upper;
            Bytes hdr{next, 0};
            append(hdr, e.body);
            while (hdr.size() % 8) hdr.push_back(0);
            hdr[1] = e.hdr_len ? *e.hdr_len : uint8_t(hdr.size() / 8 - 1);
            if (e.type == 44 && !e.hdr_len) hdr[1] = 0;  // reserved in a fragment header
            if (e.type == 43) routing_copy = hdr;
            append(ext, hdr);
        }
        if (!routing_copy.empty()) dst = final_dst6(dst, routing_copy);
        uint32_t vtf = 6u << 28 | uint32_t(h6.tclass) << 20 | (h6.flow & 0xfffff);
        put32(l3, vtf);
        put16(l3, h6.payload_len ? *h6.payload_len : uint16_t(ext.size() + t.size()));
        l3.push_back(h6.ext.empty() ? upper : h6.ext[0].type);
        l3.push_back(h6.hop_limit);
        append(l3, h6.src);
        append(l3, h6.dst);
        append(l3, ext);
        psum = pseudo_sum(6, h6.src, dst, uint32_t(t.size()));
    }
    uint16_t c = tcp.checksum ? *tcp.checksum : csum_fold(csum_add(psum, t));
    t[16] = uint8_t(c >> 8);
    t[17] = uint8_t(c);

    Bytes f;
    append(f, eth.dst);
    append(f, eth.src);
    for (const auto& v : eth.vlans) {
        put16(f, v.tpid);
        put16(f, v.tci);
    }
    put16(f, eth.ethertype ? *eth.ethertype : ethertype);
    append(f, l3);
    append(f, t);
    append(f, trailer);
    if (truncate && *truncate < f.size()) f.resize(*truncate);
    return f;
}

// ---- parsing and verification ----------------------------------------------------------------

std::optional<Located> locate(std::span<const uint8_t> f) {
    Located r;
    if (f.size() < 14) return std::nullopt;
    size_t off = 12;
    uint16_t type = get16(f, off);
    while (type == 0x8100 || type == 0x88a8) {
        off += 4;
        if (off + 2 > f.size()) return std::nullopt;
        type = get16(f, off);
    }
    off += 2;
    r.l3 = off;
    if (type == 0x0800) {
        if (off + 20 > f.size() || f[off] >> 4 != 4) return std::nullopt;
        size_t hlen = (f[off] & 0x0f) * 4u;
        size_t tot = get16(f, off + 2);
        if (hlen < 20 || f[off + 9] != 6 || (get16(f, off + 6) & 0x3fff) || tot < hlen ||
            off + tot > f.size())
            return std::nullopt;
        r.family = 4;
        r.l4 = off + hlen;
        r.l4_len = tot - hlen;
    } else if (type == 0x86dd) {
        if (off + 40 > f.size() || f[off] >> 4 != 6) return std::nullopt;
        size_t plen = get16(f, off + 4);
        if (off + 40 + plen > f.size()) return std::nullopt;
        uint8_t next = f[off + 6];
        size_t p = off + 40;
        while (next == 0 || next == 43 || next == 60) {
            if (p + 8 > f.size()) return std::nullopt;
            size_t len = (f[p + 1] + 1u) * 8;
            next = f[p];
            p += len;
        }
        if (next != 6 || p > off + 40 + plen) return std::nullopt;
        r.family = 6;
        r.l4 = p;
        r.l4_len = off + 40 + plen - p;
    } else {
        return std::nullopt;
    }
    if (r.l4_len < 20 || r.l4 + r.l4_len > f.size()) return std::nullopt;
    return r;
}

std::string checksum_errors(std::span<const uint8_t> f) {
    auto loc = locate(f);
    if (!loc) return "not a complete TCP/IP frame";
    std::string err;
    char buf[128];
    uint32_t psum;
    if (loc->family == 4) {
        size_t hlen = (f[loc->l3] & 0x0f) * 4u;
        uint16_t c = csum_fold(csum_add(0, f.subspan(loc->l3, hlen)));
        if (c != 0) {
            snprintf(buf, sizeof buf, "IPv4 header checksum %04x is off (residue %04x); ",
                     get16(f, loc->l3 + 10), c);
            err += buf;
        }
        psum = pseudo_sum(4, f.subspan(loc->l3 + 12, 4), f.subspan(loc->l3 + 16, 4),
                          uint32_t(loc->l4_len));
    } else {
        std::span<const uint8_t> dst = f.subspan(loc->l3 + 24, 16);
        uint8_t next = f[loc->l3 + 6];
        size_t p = loc->l3 + 40;
        while (p < loc->l4) {
            size_t len = (f[p + 1] + 1u) * 8;
            if (next == 43) dst = final_dst6(dst, f.subspan(p, len));
            next = f[p];
            p += len;
        }
        psum = pseudo_sum(6, f.subspan(loc->l3 + 8, 16), dst, uint32_t(loc->l4_len));
    }
    uint16_t c = csum_fold(csum_add(psum, f.subspan(loc->l4, loc->l4_len)));
    if (c != 0) {
        snprintf(buf, sizeof buf, "TCP checksum %04x is off (residue %04x)", get16(f, loc->l4 + 16),
                 c);
        err += buf;
    }
    return err;
}

std::string hexdump(std::span<const uint8_t> b, std::span<const uint8_t> other) {
    std::string s;
    char buf[48];
    for (size_t i = 0; i < b.size(); i++) {
        if (i % 16 == 0) {
            snprintf(buf, sizeof buf, "%s%04zx:", i ? "\n" : "", i);
            s += buf;
        }
        bool diff = !other.empty() && (i >= other.size() || other[i] != b[i]);
        snprintf(buf, sizeof buf, "%c%02x", diff ? '*' : ' ', b[i]);
        s += buf;
    }
    if (!other.empty() && other.size() > b.size()) {
        snprintf(buf, sizeof buf, "\n(+%zu)", other.size() - b.size());
        s += buf;
    }
    return s;
}

}  // namespace mpsteer::test
