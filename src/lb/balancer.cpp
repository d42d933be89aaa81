// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lb/balancer.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "datapath/datapath.h"
#include "mps_lb.skel.h"

namespace mpsteer::lb {

namespace {

[[noreturn]] void fail(const std::string& what, int err) {
    throw std::runtime_error("balancer: " + what + ": " + std::strerror(err < 0 ? -err : err));
}

}  // namespace

void Balancer::SkelDeleter::operator()(mps_lb* s) const {
    mps_lb__destroy(s);
}

Balancer::Balancer(const Sizes& sizes, const std::string& pin_dir) : table_size_(sizes.table) {
    if (sizes.table > MPS_LB_TABLE_MAX)
        throw std::invalid_argument("balancer: a table of " + std::to_string(sizes.table) +
                                    " slots (at most " + std::to_string(MPS_LB_TABLE_MAX) + ")");
    skel_.reset(mps_lb__open());
    if (!skel_) fail("opening the datapath", errno);
    if (int err = bpf_map__set_max_entries(skel_->maps.lb_flows, std::max(sizes.flows, 1024u)))
        fail("sizing the flow table", err);
    if (int err = bpf_map__set_max_entries(skel_->maps.lb_tokens, std::max(sizes.tokens, 1024u)))
        fail("sizing the token table", err);
    if (!pin_dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(pin_dir, ec);
        reused_ = std::filesystem::exists(pin_dir + "/lb_flows", ec);
        bpf_map* m;
        bpf_object__for_each_map(m, skel_->obj) {
            if (bpf_map__is_internal(m)) continue;
            const std::string path = pin_dir + "/" + bpf_map__name(m);
            if (int err = bpf_map__set_pin_path(m, path.c_str())) fail("pinning " + path, err);
        }
    }
    if (int err = mps_lb__load(skel_.get()))
        fail(reused_ ? "taking over the tables pinned in " + pin_dir + " (other sizes?)"
                     : "loading the datapath",
             err);
    if (reused_) {
        const uint32_t zero = 0;
        mps_lb_params p{};
        if (!bpf_map_lookup_elem(bpf_map__fd(skel_->maps.lb_params), &zero, &p) &&
            p.table_size == table_size_)
            active_ = p.active;
    }
    rb_ = ring_buffer__new(bpf_map__fd(skel_->maps.lb_learn), &Balancer::on_learn, this, nullptr);
    if (!rb_) fail("opening the key ring", errno);
}

Balancer::~Balancer() {
    ring_buffer__free(rb_);
}

int Balancer::prog_fd() const {
    return bpf_program__fd(skel_->progs.lb_ingress);
}

int Balancer::veth_peer_prog_fd() const {
    return bpf_program__fd(skel_->progs.lb_veth_peer);
}

void Balancer::set_services(const std::vector<Service>& services) {
    if (services.size() > MPS_LB_MAX_VIPS)
        throw std::invalid_argument("balancer: " + std::to_string(services.size()) +
                                    " services (at most " + std::to_string(MPS_LB_MAX_VIPS) + ")");
    std::vector<mps_lb_vip_key> keys;
    for (const auto& s : services) {
        if (s.family != 4 && s.family != 6)
            throw std::invalid_argument("balancer: a service of family " +
                                        std::to_string(s.family));
        mps_lb_vip_key k{};
        k.family = s.family;
        k.port = htons(s.port);
        std::memcpy(k.addr, s.addr.data(), s.family == 4 ? 4 : 16);
        for (const auto& o : keys)
            if (!std::memcmp(&o, &k, sizeof k))
                throw std::invalid_argument("balancer: a service given twice");
        keys.push_back(k);
    }
    const int fd = bpf_map__fd(skel_->maps.lb_vips);
    // Added first, then the ones no longer given removed: a service that stays never misses.
    for (size_t i = 0; i < keys.size(); ++i) {
        mps_lb_vip v{};
        v.unknown_token = static_cast<uint8_t>(services[i].unknown_token);
        if (bpf_map_update_elem(fd, &keys[i], &v, BPF_ANY)) fail("writing a service", errno);
    }
    mps_lb_vip_key cur{}, next{};
    std::vector<mps_lb_vip_key> stale;
    for (void* at = nullptr; !bpf_map_get_next_key(fd, at, &next); at = &cur) {
        cur = next;
        if (std::none_of(keys.begin(), keys.end(),
                         [&](const auto& k) { return !std::memcmp(&k, &cur, sizeof k); }))
            stale.push_back(cur);
    }
    for (const auto& k : stale) bpf_map_delete_elem(fd, &k);
}

void Balancer::set_backends(const std::vector<Target>& targets) {
    std::vector<Backend> backends;
    for (const auto& t : targets) backends.push_back(t.backend);
    const auto table = maglev_table(backends, table_size_);  // throws on bad input

    // Stable indices: a name keeps its own; a new one takes the lowest free.
    std::map<std::string, uint32_t> index;
    std::set<uint32_t> used;
    for (const auto& t : targets)
        if (auto it = index_.find(t.backend.name); it != index_.end()) {
            index[t.backend.name] = it->second;
            used.insert(it->second);
        }
    uint32_t free_at = 0;
    for (const auto& t : targets) {
        if (index.count(t.backend.name)) continue;
        while (used.count(free_at)) ++free_at;
        if (free_at >= MPS_LB_MAX_BACKENDS)
            throw std::invalid_argument("balancer: more than " +
                                        std::to_string(MPS_LB_MAX_BACKENDS) + " backends");
        index[t.backend.name] = free_at;
        used.insert(free_at);
    }

    const int bfd = bpf_map__fd(skel_->maps.lb_backends);
    for (const auto& t : targets) {
        mps_lb_backend b{};
        std::memcpy(b.mac, t.mac.data(), 6);
        std::memcpy(b.src_mac, t.src_mac.data(), 6);
        b.ifindex = t.ifindex;
        b.flags = MPS_LB_BACKEND_LIVE;
        const uint32_t i = index[t.backend.name];
        if (bpf_map_update_elem(bfd, &i, &b, BPF_ANY)) fail("writing a backend", errno);
    }

    // The idle table, then the switch: a packet sees the old table or the new one.
    const uint32_t idle = active_ ^ 1;
    std::vector<uint32_t> keys(table.size()), values(table.size());
    for (size_t s = 0; s < table.size(); ++s) {
        keys[s] = idle * MPS_LB_TABLE_MAX + static_cast<uint32_t>(s);
        values[s] = table[s] < 0 ? MPS_LB_MAX_BACKENDS : index[targets[table[s]].backend.name];
    }
    uint32_t n = static_cast<uint32_t>(keys.size());
    if (bpf_map_update_batch(bpf_map__fd(skel_->maps.lb_table), keys.data(), values.data(), &n,
                             nullptr))
        fail("writing the lookup table", errno);
    const uint32_t zero = 0;
    mps_lb_params p{table_size_, idle};
    if (bpf_map_update_elem(bpf_map__fd(skel_->maps.lb_params), &zero, &p, BPF_ANY))
        fail("switching the lookup table", errno);
    active_ = idle;

    // Backends no longer given stop forwarding (their flows' packets are dropped).
    for (const auto& [name, i] : index_)
        if (!index.count(name)) {
            mps_lb_backend gone{};
            bpf_map_update_elem(bfd, &i, &gone, BPF_ANY);
        }
    index_ = std::move(index);
}

void Balancer::restore_backend_indices(std::map<std::string, uint32_t> index) {
    for (const auto& [name, i] : index)
        if (i >= MPS_LB_MAX_BACKENDS)
            throw std::invalid_argument("balancer: backend '" + name + "' at index " +
                                        std::to_string(i));
    index_ = std::move(index);
}

int Balancer::index_of(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : static_cast<int>(it->second);
}

int Balancer::on_learn(void* self, void* data, size_t size) {
    auto* b = static_cast<Balancer*>(self);
    if (size < sizeof(mps_lb_learn)) return 0;
    mps_lb_learn e;
    std::memcpy(&e, data, sizeof e);
    const uint32_t token = datapath::mptcp_key_ids(e.server_key).token;
    b->own_token(token, e.backend);
    ++b->learnt_;
    return 0;
}

size_t Balancer::learn(std::chrono::milliseconds timeout) {
    learnt_ = 0;
    if (ring_buffer__poll(rb_, static_cast<int>(timeout.count())) < 0 && errno != EINTR)
        fail("reading the key ring", errno);
    return learnt_;
}

void Balancer::own_token(uint32_t token, uint32_t backend_index) {
    const int fd = bpf_map__fd(skel_->maps.lb_tokens);
    mps_lb_token t{};
    if (!bpf_map_lookup_elem(fd, &token, &t) && t.backend == backend_index) return;
    t = {};
    t.backend = backend_index;
    if (bpf_map_update_elem(fd, &token, &t, BPF_ANY)) fail("writing a token", errno);
}

int Balancer::owner_of(uint32_t token) const {
    mps_lb_token t{};
    if (bpf_map_lookup_elem(bpf_map__fd(skel_->maps.lb_tokens), &token, &t)) return -1;
    return static_cast<int>(t.backend);
}

const char* counter_name(uint32_t counter) {
    static constexpr const char* names[] = {
        "packets",       "new_flows", "flow_hits",   "hashed",     "joins_routed",
        "joins_unknown", "keys_seen", "events_lost", "no_backend", "malformed"};
    static_assert(std::size(names) == MPS_LB_C_MAX, "a name for every counter of lb.h");
    return counter < MPS_LB_C_MAX ? names[counter] : "unknown";
}

Counters Balancer::counters() const {
    Counters out{};
    const int ncpu = libbpf_num_possible_cpus();
    if (ncpu <= 0) fail("counting CPUs", ncpu);
    std::vector<uint64_t> per(ncpu);
    for (uint32_t i = 0; i < MPS_LB_C_MAX; ++i) {
        if (bpf_map_lookup_elem(bpf_map__fd(skel_->maps.lb_counters), &i, per.data()))
            fail("reading the counters", errno);
        for (uint64_t v : per) out[i] += v;
    }
    return out;
}

}  // namespace mpsteer::lb
