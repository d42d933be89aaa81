// The userspace side of the option-rewriting actors; see actors.h.
#include "datapath/actors.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>

static_assert(sizeof(mps_announce_key) == 44, "mps_announce_key layout (abi.h)");
static_assert(sizeof(mps_announce) == 96, "mps_announce layout (abi.h)");
static_assert(offsetof(mps_announce, opt) == 60, "mps_announce layout (abi.h)");
static_assert(sizeof(mps_add_request) == 16, "mps_add_request layout (abi.h)");
static_assert(sizeof(mps_prio_sent) == 24, "mps_prio_sent layout (abi.h)");

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
    char buf[INET6_ADDRSTRLEN] = {};
    const bool v6 = value.family == 6;
    inet_ntop(v6 ? AF_INET6 : AF_INET, value.addr, buf, sizeof buf);
    std::string a = buf;
    if (!value.port) return a;
    return (v6 ? "[" + a + "]" : a) + ":" + std::to_string(value.port);
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
    if (!a) throw Error("add_subflow: no stored announcement with address id " +
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

void ActorMaps::forget_prio(const mps_flow_key& k) { bpf_map_delete_elem(prio_.get(), &k); }

}  // namespace mpsteer::datapath
