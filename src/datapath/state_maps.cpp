// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The shared state maps (StateMaps: flows, connections, events, the actors' memory), pinned
// and adopted across generations and agent restarts, with the control program that writes
// flow fields; and the small things every part of the datapath starts from: owned file
// descriptors, libbpf's logging, bpffs, interface names, per-CPU arrays.
#include "datapath/internal.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>

#include "mps_ctl.skel.h"

namespace fs = std::filesystem;

namespace mpsteer::datapath {

using detail::fail;

namespace {
constexpr unsigned long kBpfFsMagic = 0xcafe4a11;

std::mutex refusal_mutex;
detail::Refusal refusal;  // last_refusal()

int libbpf_print(enum libbpf_print_level level, const char* fmt, va_list args) {
    va_list again;
    va_copy(again, args);
    const int n = std::vsnprintf(nullptr, 0, fmt, again);
    va_end(again);
    if (n <= 0) return n;
    std::string buf(size_t(n) + 1, '\0');
    std::vsnprintf(buf.data(), buf.size(), fmt, args);
    buf.resize(size_t(n));
    while (!buf.empty() && buf.back() == '\n') buf.pop_back();
    // A refused program's verifier log: its verdict for the error, the whole log at debug.
    constexpr std::string_view kBegin = "-- BEGIN PROG LOAD LOG --",
                               kEnd = "-- END PROG LOAD LOG --";
    if (auto b = buf.find(kBegin); b != std::string::npos) {
        std::string_view log(buf);
        log = log.substr(b + kBegin.size());
        log = log.substr(0, log.find(kEnd));
        std::string prog;
        if (auto q = buf.find("prog '"); q != std::string::npos && q < b)
            prog = buf.substr(q + 6, buf.find('\'', q + 6) - q - 6);
        {
            std::lock_guard lock(refusal_mutex);
            refusal = {prog, detail::verifier_verdict(log)};
        }
        spdlog::debug("libbpf: {}", buf);
        return n;
    }
    switch (level) {  // one level quieter than libbpf says: it is chatty about normal events
    case LIBBPF_WARN: spdlog::info("libbpf: {}", buf); break;
    case LIBBPF_INFO: spdlog::debug("libbpf: {}", buf); break;
    default: spdlog::trace("libbpf: {}", buf); break;
    }
    return n;
}

uint32_t max_entries_of(int fd) {
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len)) fail("reading a state map's size", errno);
    return info.max_entries;
}

// The pinned map at `path`, or a new one of `max_entries` pinned there. An adopted map keeps
// its size: a different one asked for is reported, not applied (its entries are live flows).
Fd create_or_adopt(const std::string& path, bpf_map_type type, uint32_t key, uint32_t value,
                   uint32_t max_entries, const char* name) {
    Fd map(bpf_obj_get(path.c_str()));
    if (!map) {
        map.reset(bpf_map_create(type, name, key, value, max_entries, nullptr));
        if (!map) fail(std::string("creating map ") + name, errno);
        if (bpf_obj_pin(map.get(), path.c_str())) {
            int err = errno;
            // Someone else pinned it first: use theirs.
            map.reset(err == EEXIST ? bpf_obj_get(path.c_str()) : -1);
            if (!map) fail("pinning " + path, err);
        }
    }
    if (uint32_t have = max_entries_of(map.get()); have != max_entries)
        spdlog::warn(
            "state table {} was made with {} entries and is kept at that size (it holds "
            "live state); `mpsteer reset` before a start applies {}",
            name, have, max_entries);
    return map;
}

// Reads every entry of a hash table in batches (one system call per 4096 entries), handing
// each batch to `batch(keys, values, n)`; `what` names the read in errors.
void for_each_batch(int fd, const char* what,
                    const std::function<void(uint8_t* keys, uint8_t* values, uint32_t n)>& batch) {
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len)) fail("reading a state map's info", errno);
    constexpr uint32_t kBatch = 4096;
    std::vector<uint8_t> keys(size_t(kBatch) * info.key_size),
        values(size_t(kBatch) * info.value_size);
    uint64_t token = 0;  // the kernel's cursor: a bucket index for hash tables
    for (bool first = true;; first = false) {
        uint32_t n = kBatch;
        int r = bpf_map_lookup_batch(fd, first ? nullptr : &token, &token, keys.data(),
                                     values.data(), &n, nullptr);
        if (r && errno != ENOENT) fail(what, errno);
        if (n) batch(keys.data(), values.data(), n);
        if (r) return;  // ENOENT: that was the last batch
    }
}

uint64_t count_entries(int fd) {
    uint64_t total = 0;
    for_each_batch(fd, "counting a state table's entries",
                   [&](uint8_t*, uint8_t*, uint32_t n) { total += n; });
    return total;
}

uint64_t memlock_of(int fd) {
    std::ifstream in("/proc/self/fdinfo/" + std::to_string(fd));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("memlock:", 0) == 0) return std::stoull(line.substr(8));
    return 0;
}

// ---- carrying state over from the previous layout --------------------------------------------
// Layout 3 of struct mps_flow is layout 4 without rate_limit's right edges at its end (they were
// a table of the loaded datapath's own then): a carried flow's edges start unset, as after a
// datapath reload before, so its rate_limit starts with a full bucket.
constexpr int kPreviousLayout = 3;
static_assert(MPS_STATE_LAYOUT == kPreviousLayout + 1,
              "carry over from the layout before this one");
constexpr size_t kPreviousFlowSize = offsetof(mps_flow, rate_edge_ns);
static_assert(kPreviousFlowSize == 184 && sizeof(mps_flow) == kPreviousFlowSize + 32,
              "layout 3 as it was pinned, extended at its end");

mps_flow from_previous_layout(const uint8_t* in) {
    mps_flow f{};
    std::memcpy(&f, in, kPreviousFlowSize);
    return f;
}

// Copies every entry of the hash map `from` (values of `in_size`) into `to` (values of
// `out_size`), each value passed through `convert`. Entries that no longer fit (a smaller new
// table) are dropped by the LRU, as any eviction. Returns the entries copied.
uint64_t copy_entries(int from, int to, uint32_t in_size, uint32_t out_size,
                      const std::function<void(const uint8_t* in, uint8_t* out)>& convert) {
    uint64_t total = 0;
    std::vector<uint8_t> out;
    for_each_batch(from, "reading the previous layout's state",
                   [&](uint8_t* keys, uint8_t* values, uint32_t n) {
                       out.resize(size_t(n) * out_size);
                       for (uint32_t i = 0; i < n; ++i)
                           convert(&values[size_t(i) * in_size], &out[size_t(i) * out_size]);
                       uint32_t written = n;
                       if (bpf_map_update_batch(to, keys, out.data(), &written, nullptr))
                           fail("writing the carried-over state", errno);
                       total += written;
                   });
    return total;
}

// When the tables of this layout were just made and the previous layout's are pinned beside
// them (an agent upgraded over a running one), their entries move over and the old pins go:
// the programs still attached keep their own references until the new generation replaces
// them. Maps with an unchanged value layout are copied as they are.
void carry_over(const std::string& dir, const StateMaps& m) {
    const std::string old = "_v" + std::to_string(kPreviousLayout);
    int old_flows = bpf_obj_get((dir + "/flows" + old).c_str());
    if (old_flows < 0) return;
    Fd old_flows_fd(old_flows);
    const std::string old_names[] = {"flows",        "conns",     "events",       "announces",
                                     "add_requests", "prio_sent", "table_inserts"};
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(old_flows, &info, &len) || info.key_size != sizeof(mps_flow_key) ||
        info.value_size != kPreviousFlowSize) {  // not what that layout pinned: never read it
        spdlog::warn("state tables: {}/flows{} is not a flow table of layout {}; left alone", dir,
                     old, kPreviousLayout);
        return;
    }
    if (count_entries(m.flows()) != 0) {  // a later agent ran already: the old pins are stale
        for (const auto& name : old_names) fs::remove(dir + "/" + name + old);
        spdlog::info("state tables: removed the stale pins of layout {}", kPreviousLayout);
        return;
    }
    auto as_is = [](size_t size) {
        return [size](const uint8_t* in, uint8_t* out) { std::memcpy(out, in, size); };
    };
    const uint64_t flows = copy_entries(old_flows, m.flows(), kPreviousFlowSize, sizeof(mps_flow),
                                        [](const uint8_t* in, uint8_t* out) {
                                            const mps_flow f = from_previous_layout(in);
                                            std::memcpy(out, &f, sizeof f);
                                        });
    struct Table {
        const char* name;
        int to;
        uint32_t value;
    };
    const Table same[] = {
        {"conns", m.conns(), sizeof(mps_conn)},
        {"announces", m.announces(), sizeof(mps_announce)},
        {"add_requests", m.add_requests(), sizeof(mps_add_request)},
        {"prio_sent", m.prio_sent(), sizeof(mps_prio_sent)},
    };
    std::string carried = std::to_string(flows) + " flows";
    for (const auto& t : same) {
        int fd = bpf_obj_get((dir + "/" + t.name + old).c_str());
        if (fd < 0) continue;
        Fd from(fd);
        carried += ", " + std::to_string(copy_entries(fd, t.to, t.value, t.value, as_is(t.value))) +
                   " " + t.name;
    }
    for (const auto& name : old_names) fs::remove(dir + "/" + name + old);
    spdlog::info("state tables: carried {} over from layout {} and unpinned it", carried,
                 kPreviousLayout);
}
}  // namespace

namespace detail {
uint32_t ifindex_of(const std::string& ifname) {
    unsigned idx = if_nametoindex(ifname.c_str());
    if (!idx) throw Error("interface " + ifname + " not found");
    return idx;
}

int possible_cpus() {
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu <= 0) fail("counting CPUs", ncpu);
    return ncpu;
}

void zero_percpu(int fd, uint32_t first, uint32_t n, size_t value_size) {
    std::vector<uint32_t> keys(n);
    for (uint32_t i = 0; i < n; ++i) keys[i] = first + i;
    std::vector<uint8_t> zeros(size_t(n) * possible_cpus() * value_size);
    uint32_t count = n;
    if (bpf_map_update_batch(fd, keys.data(), zeros.data(), &count, nullptr))
        fail("clearing counters", errno);
}

namespace {
// The shared maps by their names in the BPF objects (bpf/lib/state_maps.h).
struct StateMapRef {
    const char* name;
    int (StateMaps::*fd)() const;
};
constexpr StateMapRef kStateMaps[] = {
    {"flows", &StateMaps::flows},
    {"conns", &StateMaps::conns},
    {"events", &StateMaps::events},
    {"announces", &StateMaps::announces},
    {"add_requests", &StateMaps::add_requests},
    {"prio_sent", &StateMaps::prio_sent},
    {"table_inserts", &StateMaps::table_inserts},
};
}  // namespace

void reuse_state_maps(bpf_object* obj, const StateMaps& state) {
    for (const auto& m : kStateMaps) {
        bpf_map* map = bpf_object__find_map_by_name(obj, m.name);
        if (!map) throw Error(std::string("the BPF object has no map ") + m.name);
        if (int err = bpf_map__reuse_fd(map, (state.*m.fd)()))
            fail(std::string("reusing ") + m.name, err);
    }
}

bool is_state_map(std::string_view name) {
    for (const auto& m : kStateMaps)
        if (name == m.name) return true;
    return false;
}
}  // namespace detail

std::string detail::verifier_verdict(std::string_view log) {
    std::string_view verdict;
    while (!log.empty()) {
        size_t end = log.find('\n');
        std::string_view line = log.substr(0, end);
        if (!line.empty() && !line.starts_with("processed ") &&
            !line.starts_with("verification time") && !line.starts_with("stack depth"))
            verdict = line;
        if (end == std::string_view::npos) break;
        log.remove_prefix(end + 1);
    }
    return std::string(verdict);
}

void detail::forget_refusal() {
    std::lock_guard lock(refusal_mutex);
    refusal = {};
}

detail::Refusal detail::last_refusal() {
    std::lock_guard lock(refusal_mutex);
    return refusal;
}

void init_libbpf_logging() {
    libbpf_set_print(libbpf_print);
}

void ensure_bpffs(const std::string& pin_root) {
    struct statfs st {};
    if (statfs("/sys/fs/bpf", &st) != 0 || static_cast<unsigned long>(st.f_type) != kBpfFsMagic) {
        spdlog::info("bpffs is not mounted on /sys/fs/bpf: mounting it");
        fs::create_directories("/sys/fs/bpf");
        if (mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700") != 0)
            fail("mounting bpffs on /sys/fs/bpf", errno);
    }
    std::error_code ec;
    fs::create_directories(pin_root, ec);
    if (ec) throw Error("creating " + pin_root + ": " + ec.message());
}

StateMaps StateMaps::open(const std::string& pin_root, const TableSizes& sizes) {
    if (sizes.flows < TableSizes::kMinFlows || sizes.flows > TableSizes::kMaxFlows)
        throw Error("flow table size " + std::to_string(sizes.flows) + " outside " +
                    std::to_string(TableSizes::kMinFlows) + ".." +
                    std::to_string(TableSizes::kMaxFlows));
    ensure_bpffs(pin_root);
    const std::string dir = pin_root + "/maps";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("creating " + dir + ": " + ec.message());
    const std::string v = "_v" + std::to_string(MPS_STATE_LAYOUT);
    StateMaps m;
    m.root_ = pin_root;
    m.flows_ = create_or_adopt(dir + "/flows" + v, BPF_MAP_TYPE_LRU_HASH, sizeof(mps_flow_key),
                               sizeof(mps_flow), sizes.flows, "flows");
    m.conns_ = create_or_adopt(dir + "/conns" + v, BPF_MAP_TYPE_LRU_HASH, sizeof(__u32),
                               sizeof(mps_conn), sizes.conns(), "conns");
    m.events_ = create_or_adopt(dir + "/events" + v, BPF_MAP_TYPE_RINGBUF, 0, 0, MPS_EVENTS_BYTES,
                                "events");
    m.announces_ =
        create_or_adopt(dir + "/announces" + v, BPF_MAP_TYPE_LRU_HASH, sizeof(mps_announce_key),
                        sizeof(mps_announce), sizes.announces(), "announces");
    m.add_requests_ =
        create_or_adopt(dir + "/add_requests" + v, BPF_MAP_TYPE_HASH, sizeof(mps_flow_key),
                        sizeof(mps_add_request), sizes.add_requests(), "add_requests");
    m.prio_sent_ =
        create_or_adopt(dir + "/prio_sent" + v, BPF_MAP_TYPE_LRU_HASH, sizeof(mps_flow_key),
                        sizeof(mps_prio_sent), sizes.prio_sent(), "prio_sent");
    m.table_inserts_ = create_or_adopt(dir + "/table_inserts" + v, BPF_MAP_TYPE_PERCPU_ARRAY,
                                       sizeof(__u32), sizeof(__u64), MPS_TI_MAX, "table_inserts");
    // The flow table decides the rest (an adopted one may differ from what was asked).
    m.sizes_.flows = max_entries_of(m.flows_.get());
    carry_over(dir, m);
    m.ctl_.reset(mps_ctl__open());
    if (!m.ctl_) fail("opening the control programs", errno);
    detail::reuse_state_maps(m.ctl_->obj, m);
    if (int err = mps_ctl__load(m.ctl_.get())) fail("loading the control programs", err);
    return m;
}

std::vector<TableInfo> StateMaps::tables(bool count) const {
    struct Table {
        const char* name;
        int fd;
        int inserts;  // enum mps_table_counter, or -1: no evictions counted
    };
    uint64_t flows_removed = 0;
    if (count)
        for (uint64_t n : detail::read_percpu<uint64_t>(table_inserts(), MPS_TI_FLOWS_REMOVED))
            flows_removed += n;
    const Table all[] = {{"flows", flows(), MPS_TI_FLOWS},
                         {"conns", conns(), -1},
                         {"events", events(), -1},
                         {"announces", announces(), MPS_TI_ANNOUNCES},
                         {"add_requests", add_requests(), -1},
                         {"prio_sent", prio_sent(), -1}};
    std::vector<TableInfo> out;
    for (const auto& t : all) {
        TableInfo info{t.name, max_entries_of(t.fd), memlock_of(t.fd), {}, {}};
        if (count && t.fd != events()) {
            // Inserts first: one made during the walk then counts as an entry, never as an
            // eviction.
            uint64_t inserts = 0;
            if (t.inserts >= 0)
                for (uint64_t n : detail::read_percpu<uint64_t>(table_inserts(), t.inserts))
                    inserts += n;
            if (t.inserts == MPS_TI_FLOWS) inserts -= std::min(inserts, flows_removed);
            info.entries = count_entries(t.fd);
            if (t.inserts >= 0)
                info.evictions = inserts > *info.entries ? inserts - *info.entries : 0;
        }
        out.push_back(std::move(info));
    }
    return out;
}

void StateMaps::remove_flow(const mps_flow_key& k) const {
    if (bpf_map_delete_elem(flows(), &k)) return;  // not there: nothing to count
    // Only the agent writes this counter (one agent per pin root): CPU 0's value carries it.
    auto removed = detail::read_percpu<uint64_t>(table_inserts(), MPS_TI_FLOWS_REMOVED);
    removed[0] += 1;
    const uint32_t key = MPS_TI_FLOWS_REMOVED;
    if (bpf_map_update_elem(table_inserts(), &key, removed.data(), BPF_ANY))
        fail("counting a removed flow", errno);
}

void SkeletonDeleter::operator()(mps_ctl* s) const {
    mps_ctl__destroy(s);
}

bool StateMaps::update_flow(const mps_ctl_flow_req& req) const {
    auto r = test_run(bpf_program__fd(ctl_->progs.ctl_flow_update),
                      {reinterpret_cast<const uint8_t*>(&req), sizeof req}, true);
    if (r.retval == XDP_ABORTED) throw Error("flow update: request rejected");
    return r.retval == XDP_PASS;
}

}  // namespace mpsteer::datapath
