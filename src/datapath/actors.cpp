// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The userspace side of the option-rewriting actors; see actors.h.
#include "datapath/actors.h"

#include "datapath/inet_csum.h"
#include "net/address.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>

namespace mpsteer::datapath {

namespace {
[[noreturn]] void fail(const std::string& what) {
    throw Error(what + ": " + std::strerror(errno));
}

Fd dup_of(int fd, const char* what) {
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (d < 0) fail(std::string("duplicating the fd of ") + what);
    return Fd(d);
}

Fd pinned(const std::string& path) {
    int fd = bpf_obj_get(path.c_str());
    if (fd < 0) fail("opening " + path);
    return Fd(fd);
}

uint64_t monotonic_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);  // bpf_ktime_get_ns()'s clock
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}
}  // namespace

std::string Announcement::address() const {
    return value.port ? net::endpoint_text(value.family, value.addr, value.port)
                      : net::address_text(value.family, value.addr);
}

std::string_view to_string(mps_announce_state s) {
    switch (s) {
    case MPS_ANN_BLOCKED: return "blocked";
    case MPS_ANN_PENDING: return "pending";
    case MPS_ANN_INJECTING: return "injecting";
    case MPS_ANN_RELEASED: return "released";
    }
    return "?";
}

ActorMaps ActorMaps::of(const StateMaps& s) {
    ActorMaps m;
    m.announces_ = dup_of(s.announces(), "announces");
    m.requests_ = dup_of(s.add_requests(), "add_requests");
    m.prio_ = dup_of(s.prio_sent(), "prio_sent");
    return m;
}

ActorMaps ActorMaps::of(const Generation& g) {
    ActorMaps m;
    m.announces_ = dup_of(g.map_fd("announces"), "announces");
    m.requests_ = dup_of(g.map_fd("add_requests"), "add_requests");
    m.prio_ = dup_of(g.map_fd("prio_sent"), "prio_sent");
    m.tmpl_ = dup_of(g.map_fd("prio_tmpl"), "prio_tmpl");
    return m;
}

ActorMaps ActorMaps::open(const std::string& announces, const std::string& add_requests,
                          const std::string& prio_sent) {
    ActorMaps m;
    m.announces_ = pinned(announces);
    m.requests_ = pinned(add_requests);
    m.prio_ = pinned(prio_sent);
    return m;
}

std::vector<Announcement> ActorMaps::announcements() const {
    std::vector<Announcement> out;
    mps_announce_key key{}, next{};
    const mps_announce_key* prev = nullptr;
    while (bpf_map_get_next_key(announces_.get(), prev, &next) == 0) {
        Announcement a;
        a.key = next;
        if (bpf_map_lookup_elem(announces_.get(), &next, &a.value) == 0) out.push_back(a);
        key = next;
        prev = &key;
    }
    std::sort(out.begin(), out.end(), [](const Announcement& x, const Announcement& y) {
        return x.value.first_ns < y.value.first_ns;
    });
    return out;
}

std::optional<Announcement> ActorMaps::find(const mps_announce_key& k) const {
    Announcement a;
    a.key = k;
    if (bpf_map_lookup_elem(announces_.get(), &k, &a.value) != 0) return std::nullopt;
    return a;
}

bool ActorMaps::request_add_subflow(const mps_announce_key& k) {
    auto a = find(k);
    if (!a)
        throw Error("add_subflow: no stored announcement with address id " +
                    std::to_string(k.addr_id) + " on that flow");
    if (a->value.state == MPS_ANN_RELEASED || a->value.state == MPS_ANN_INJECTING) return false;
    // State first, then the request: the datapath acts on a request only for a pending
    // announcement. (A concurrent `hidden` increment may be lost; it is a statistic.)
    a->value.state = MPS_ANN_PENDING;
    if (bpf_map_update_elem(announces_.get(), &k, &a->value, BPF_EXIST))
        fail("add_subflow: marking the announcement pending");
    mps_add_request rq{};
    rq.addr_id = k.addr_id;
    rq.requested_ns = monotonic_ns();
    if (bpf_map_update_elem(requests_.get(), &k.flow, &rq, BPF_ANY))
        fail("add_subflow: queueing the request");
    return true;
}

void ActorMaps::block_again(const mps_announce_key& k) {
    auto a = find(k);
    if (!a) throw Error("block: no stored announcement with that key");
    bpf_map_delete_elem(requests_.get(), &k.flow);
    a->value.state = MPS_ANN_BLOCKED;
    if (bpf_map_update_elem(announces_.get(), &k, &a->value, BPF_EXIST))
        fail("block: updating the announcement");
}

std::optional<mps_prio_sent> ActorMaps::prio_sent(const mps_flow_key& k) const {
    mps_prio_sent v{};
    if (bpf_map_lookup_elem(prio_.get(), &k, &v) != 0) return std::nullopt;
    return v;
}

void ActorMaps::forget_prio(const mps_flow_key& k) {
    bpf_map_delete_elem(prio_.get(), &k);
}

namespace {
void put16(uint8_t* p, uint16_t v) {
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}
uint32_t get32(const uint8_t* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
}  // namespace

std::vector<uint8_t> prio_frame(const mps_prio_tmpl& t, bool backup) {
    const size_t l3 = t.l3_off, l4 = t.l4_off, len = t.len;
    if (len > MPS_PRIO_TMPL_HDR || l4 + 20 > len || l3 > l4 || (t.family != 4 && t.family != 6))
        return {};
    const uint8_t* h = t.hdr;
    const size_t hlen = size_t(h[l4 + 12] >> 4) * 4;
    if (hlen < 20 || l4 + hlen != len) return {};
    if (t.family == 4 ? (l3 + 20 > l4 || h[l3] >> 4 != 4) : (l3 + 40 != l4 || h[l3] >> 4 != 6))
        return {};
    // The timestamps of the template, if any (a well-formed walk, else none).
    const uint8_t* ts = nullptr;
    for (size_t i = l4 + 20; i < len;) {
        uint8_t kind = h[i];
        if (kind == 0) break;
        if (kind == 1) {
            i++;
            continue;
        }
        if (i + 1 >= len || h[i + 1] < 2 || i + h[i + 1] > len) {
            ts = nullptr;
            break;
        }
        if (kind == 8 && h[i + 1] == 10) ts = h + i;
        i += h[i + 1];
    }
    std::vector<uint8_t> f(h, h + l4 + 20);
    uint8_t* tcp = f.data() + l4;
    uint32_t seq = get32(h + l4 + 4) + t.next;
    tcp[4] = uint8_t(seq >> 24);
    tcp[5] = uint8_t(seq >> 16);
    tcp[6] = uint8_t(seq >> 8);
    tcp[7] = uint8_t(seq);
    tcp[13] = 0x10;      // ACK only
    put16(tcp + 16, 0);  // checksum
    put16(tcp + 18, 0);  // urgent pointer
    if (ts) {
        f.push_back(1);
        f.push_back(1);
        f.insert(f.end(), ts, ts + 10);
    }
    const uint8_t prio[4] = {1, 30, 3, uint8_t(0x50 | (backup ? 1 : 0))};
    f.insert(f.end(), prio, prio + 4);
    tcp = f.data() + l4;
    const size_t tcplen = f.size() - l4;
    tcp[12] = uint8_t((tcplen / 4) << 4);
    uint8_t* ip = f.data() + l3;
    uint32_t ps;
    if (t.family == 4) {
        put16(ip + 2, uint16_t(f.size() - l3));
        put16(ip + 10, 0);
        put16(ip + 10, csum_fold(csum_add(ip, l4 - l3)));
        ps = csum_add(ip + 12, 8);
    } else {
        put16(ip + 4, uint16_t(tcplen));
        ps = csum_add(ip + 8, 32);
    }
    ps += IPPROTO_TCP + uint32_t(tcplen);
    uint16_t c = csum_fold(csum_add(tcp, tcplen, ps));
    put16(tcp + 16, c);
    return f;
}

std::vector<PrioTemplate> ActorMaps::prio_templates() const {
    std::vector<PrioTemplate> out;
    if (!tmpl_) throw Error("set_backup templates: this ActorMaps has no prio_tmpl map");
    mps_prio_tmpl_key key{}, next{};
    const mps_prio_tmpl_key* prev = nullptr;
    while (bpf_map_get_next_key(tmpl_.get(), prev, &next) == 0) {
        PrioTemplate t;
        t.key = next;
        // The datapath rewrites a template in place: read until two copies agree.
        mps_prio_tmpl again{};
        bool ok = false;
        for (int i = 0; i < 8 && !ok; i++) {
            if (bpf_map_lookup_elem(tmpl_.get(), &next, &t.value) != 0) break;
            if (bpf_map_lookup_elem(tmpl_.get(), &next, &again) != 0) break;
            ok = std::memcmp(&t.value, &again, sizeof again) == 0;
        }
        if (ok) out.push_back(t);
        key = next;
        prev = &key;
    }
    return out;
}

namespace {
// A program that passes every frame: BPF_PROG_TEST_RUN with live frames hands what it
// passes to the stack of the interface named in the context (ingress_ifindex).
Fd xdp_pass_prog() {
    const bpf_insn insns[] = {
        {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 2 /* XDP_PASS */},
        {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
    };
    int fd = bpf_prog_load(BPF_PROG_TYPE_XDP, "mps_prio_inj", "GPL", insns, 2, nullptr);
    if (fd < 0) fail("set_backup: loading the XDP_PASS program for live frames");
    return Fd(fd);
}
}  // namespace

void ActorMaps::send_prio(const PrioTemplate& t, bool backup) const {
    std::vector<uint8_t> f = prio_frame(t.value, backup);
    if (f.empty()) throw Error("set_backup: unusable packet template");
    const mps_prio_tmpl& v = t.value;
    if (v.hook == MPS_HOOK_TC_EGRESS) {
        const bool l2 = v.l3_off >= ETH_HLEN;
        const uint16_t proto = htons(v.family == 4 ? ETH_P_IP : ETH_P_IPV6);
        Fd s(socket(AF_PACKET, (l2 ? SOCK_RAW : SOCK_DGRAM) | SOCK_CLOEXEC, 0));
        if (!s) fail("set_backup: AF_PACKET socket");
        sockaddr_ll to{};
        to.sll_family = AF_PACKET;
        to.sll_ifindex = int(v.ifindex);
        to.sll_protocol = proto;
        to.sll_halen = ETH_ALEN;
        std::memcpy(to.sll_addr, f.data(), l2 ? ETH_ALEN : 0);
        const uint8_t* data = f.data() + (l2 ? 0 : v.l3_off);
        size_t n = f.size() - (l2 ? 0 : v.l3_off);
        if (sendto(s.get(), data, n, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) != ssize_t(n))
            fail("set_backup: sending MP_PRIO on ifindex " + std::to_string(v.ifindex));
        return;
    }
    // XDP or TC ingress: as if received on that interface.
    if (v.l3_off != ETH_HLEN) throw Error("set_backup: ingress template without Ethernet");
    static Fd prog = xdp_pass_prog();
    xdp_md ctx{};
    ctx.data_end = uint32_t(f.size());
    ctx.ingress_ifindex = v.ifindex;
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = f.data(), .data_size_in = uint32_t(f.size()),
                .ctx_in = &ctx, .ctx_size_in = sizeof ctx, .repeat = 1,
                .flags = BPF_F_TEST_XDP_LIVE_FRAMES);
    if (bpf_prog_test_run_opts(prog.get(), &opts) != 0)
        fail("set_backup: injecting MP_PRIO on ifindex " + std::to_string(v.ifindex));
}

int ActorMaps::signal_prio(uint16_t pc, bool backup, uint64_t min_idle_ns) {
    int sent = 0;
    const uint64_t now = monotonic_ns();
    for (const PrioTemplate& t : prio_templates()) {
        if (t.value.pc != pc || now - t.value.ns < min_idle_ns) continue;
        const unsigned d = t.key.dir & 1;
        auto ps = prio_sent(t.key.flow);
        if (ps && ps->sent[d] == (backup ? 2 : 1)) continue;
        send_prio(t, backup);
        mps_prio_sent v = ps.value_or(mps_prio_sent{});
        v.sent[d] = backup ? 2 : 1;
        v.ns[d] = monotonic_ns();
        if (bpf_map_update_elem(prio_.get(), &t.key.flow, &v, BPF_ANY))
            fail("set_backup: recording the signal");
        sent++;
    }
    return sent;
}

}  // namespace mpsteer::datapath
