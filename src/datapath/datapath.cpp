#include "datapath/datapath.h"

#include "datapath/compiled_entry.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "mps_ctl.skel.h"
#include "mps_dp.skel.h"

namespace fs = std::filesystem;

namespace mpsteer::datapath {

namespace {
constexpr unsigned long kBpfFsMagic = 0xcafe4a11;
// Not in Debian 12's UAPI headers (Linux 6.1); values from Linux 6.6's enum bpf_attach_type.
constexpr int kAttachTcxIngress = 46;
constexpr int kAttachTcxEgress = 47;
// Handle and priority of our clsact filter on kernels without TCX.
constexpr uint32_t kTcHandle = 0x6d70;  // "mp"
constexpr uint32_t kTcPriority = 1;

[[noreturn]] void fail(const std::string& what, int err) {
    throw Error(what + ": " + std::strerror(err < 0 ? -err : err));
}

int libbpf_print(enum libbpf_print_level level, const char* fmt, va_list args) {
    char buf[4096];
    int n = std::vsnprintf(buf, sizeof buf, fmt, args);
    while (n > 0 && static_cast<size_t>(n) <= sizeof buf && (buf[n - 1] == '\n')) buf[--n] = 0;
    switch (level) {  // one level quieter than libbpf says: it is chatty about normal events
    case LIBBPF_WARN: spdlog::info("libbpf: {}", buf); break;
    case LIBBPF_INFO: spdlog::debug("libbpf: {}", buf); break;
    default: spdlog::trace("libbpf: {}", buf); break;
    }
    return n;
}

Fd create_or_adopt(const std::string& path, bpf_map_type type, uint32_t key, uint32_t value,
                   uint32_t max_entries, const char* name) {
    int fd = bpf_obj_get(path.c_str());
    if (fd >= 0) return Fd(fd);
    fd = bpf_map_create(type, name, key, value, max_entries, nullptr);
    if (fd < 0) fail(std::string("creating map ") + name, errno);
    if (bpf_obj_pin(fd, path.c_str())) {
        int err = errno;
        close(fd);
        // Someone else pinned it first: use theirs.
        if (err == EEXIST && (fd = bpf_obj_get(path.c_str())) >= 0) return Fd(fd);
        fail("pinning " + path, err);
    }
    return Fd(fd);
}

std::string prog_for(mps_prog p, bool xdp) {
    return std::string(prog_name(p)) + (xdp ? "_xdp" : "_tc");
}

uint32_t ifindex_of(const std::string& ifname) {
    unsigned idx = if_nametoindex(ifname.c_str());
    if (!idx) throw Error("interface " + ifname + " not found");
    return idx;
}
}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) close(fd_);
        fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0) close(fd_);
}

void init_libbpf_logging() { libbpf_set_print(libbpf_print); }

void ensure_bpffs(const std::string& pin_root) {
    struct statfs st {};
    if (statfs("/sys/fs/bpf", &st) != 0 || st.f_type != kBpfFsMagic) {
        spdlog::info("bpffs is not mounted on /sys/fs/bpf: mounting it");
        fs::create_directories("/sys/fs/bpf");
        if (mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700") != 0)
            fail("mounting bpffs on /sys/fs/bpf", errno);
    }
    std::error_code ec;
    fs::create_directories(pin_root, ec);
    if (ec) throw Error("creating " + pin_root + ": " + ec.message());
}

StateMaps StateMaps::open(const std::string& pin_root) {
    ensure_bpffs(pin_root);
    const std::string dir = pin_root + "/maps";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("creating " + dir + ": " + ec.message());
    const std::string v = "_v" + std::to_string(MPS_STATE_LAYOUT);
    StateMaps m;
    m.root_ = pin_root;
    m.flows_ = create_or_adopt(dir + "/flows" + v, BPF_MAP_TYPE_LRU_HASH, sizeof(mps_flow_key),
                               sizeof(mps_flow), MPS_FLOWS_MAX, "flows");
    m.conns_ = create_or_adopt(dir + "/conns" + v, BPF_MAP_TYPE_LRU_HASH, sizeof(__u32),
                               sizeof(mps_conn), MPS_CONNS_MAX, "conns");
    m.events_ = create_or_adopt(dir + "/events" + v, BPF_MAP_TYPE_RINGBUF, 0, 0,
                                MPS_EVENTS_BYTES, "events");
    m.announces_ = create_or_adopt(dir + "/announces" + v, BPF_MAP_TYPE_LRU_HASH,
                                   sizeof(mps_announce_key), sizeof(mps_announce),
                                   MPS_ANNOUNCES_MAX, "announces");
    m.add_requests_ = create_or_adopt(dir + "/add_requests" + v, BPF_MAP_TYPE_HASH,
                                      sizeof(mps_flow_key), sizeof(mps_add_request), 1024,
                                      "add_requests");
    m.prio_sent_ = create_or_adopt(dir + "/prio_sent" + v, BPF_MAP_TYPE_LRU_HASH,
                                   sizeof(mps_flow_key), sizeof(mps_prio_sent), MPS_FLOWS_MAX,
                                   "prio_sent");
    m.ctl_.reset(mps_ctl__open());
    if (!m.ctl_) fail("opening the control programs", errno);
    if (int err = bpf_map__reuse_fd(m.ctl_->maps.flows, m.flows_.get()))
        fail("reusing flows for the control programs", err);
    if (int err = bpf_map__reuse_fd(m.ctl_->maps.conns, m.conns_.get()))
        fail("reusing conns for the control programs", err);
    if (int err = mps_ctl__load(m.ctl_.get())) fail("loading the control programs", err);
    return m;
}

void StateMaps::CtlDeleter::operator()(mps_ctl* c) const { mps_ctl__destroy(c); }

bool StateMaps::update_flow(const mps_ctl_flow_req& req) const {
    auto r = test_run(bpf_program__fd(ctl_->progs.ctl_flow_update),
                      {reinterpret_cast<const uint8_t*>(&req), sizeof req}, true);
    if (r.retval == XDP_ABORTED) throw Error("flow update: request rejected");
    return r.retval == XDP_PASS;
}

// ---- Datapath ----------------------------------------------------------------------------

namespace {
// The maps every Datapath reuses from StateMaps (pinned there).
const std::set<std::string> kSharedMaps = {"flows",        "conns",     "events", "announces",
                                           "add_requests", "prio_sent"};
// Programs every chain needs; the agent's pre-flight entries.
const char* const kAlways[] = {"entry_xdp", "entry_tc_egress", "entry_tc_ingress", "interp_xdp",
                               "interp_tc"};
const char* const kPreflight[] = {"preflight_xdp", "preflight_tc_egress", "preflight_tc_ingress"};

const char* entry_name(Hook h, bool preflight) {
    switch (h) {
    case Hook::xdp: return preflight ? "preflight_xdp" : "entry_xdp";
    case Hook::tc_egress: return preflight ? "preflight_tc_egress" : "entry_tc_egress";
    case Hook::tc_ingress: return preflight ? "preflight_tc_ingress" : "entry_tc_ingress";
    }
    return "";
}

// Per-CPU values are laid out at 8-byte strides, one per possible CPU.
int possible_cpus() {
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu <= 0) fail("counting CPUs", ncpu);
    return ncpu;
}

template <typename T>
std::vector<T> read_percpu(int fd, uint32_t key) {
    std::vector<T> vals(possible_cpus());
    static_assert(sizeof(T) % 8 == 0);
    if (bpf_map_lookup_elem(fd, &key, vals.data())) fail("reading counters", errno);
    return vals;
}

// Zeroes keys [first, first + n) of a per-CPU array in one syscall.
void zero_percpu(int fd, uint32_t first, uint32_t n, size_t value_size) {
    std::vector<uint32_t> keys(n);
    for (uint32_t i = 0; i < n; ++i) keys[i] = first + i;
    std::vector<uint8_t> zeros(size_t(n) * possible_cpus() * value_size);
    uint32_t count = n;
    if (bpf_map_update_batch(fd, keys.data(), zeros.data(), &count, nullptr))
        fail("clearing counters", errno);
}
}  // namespace

std::string Datapath::object_id() {
    static const std::string id = [] {  // the object is part of the binary: hash it once
        size_t size = 0;
        const void* bytes = mps_dp__elf_bytes(&size);
        unsigned char h[SHA256_DIGEST_LENGTH];
        SHA256(static_cast<const unsigned char*>(bytes), size, h);
        char hex[13];
        for (int i = 0; i < 6; ++i) std::snprintf(hex + 2 * i, 3, "%02x", h[i]);
        return std::string(hex);
    }();
    return id;
}

std::shared_ptr<Datapath> Datapath::load(const StateMaps& state,
                                         const std::vector<std::string>& only) {
    std::shared_ptr<Datapath> dp(new Datapath());
    dp->skel_ = mps_dp__open();
    if (!dp->skel_) fail("opening the BPF object", errno);
    auto* s = dp->skel_;
    // Shared state first, so every datapath sees the same flows.
    for (auto [map, fd] : {std::pair{s->maps.flows, state.flows()},
                           std::pair{s->maps.conns, state.conns()},
                           std::pair{s->maps.events, state.events()},
                           std::pair{s->maps.announces, state.announces()},
                           std::pair{s->maps.add_requests, state.add_requests()},
                           std::pair{s->maps.prio_sent, state.prio_sent()}})
        if (int err = bpf_map__reuse_fd(map, fd))
            fail(std::string("reusing ") + bpf_map__name(map), err);
    if (!only.empty()) {
        std::set<std::string> wanted(only.begin(), only.end());
        wanted.insert(std::begin(kAlways), std::end(kAlways));
        bpf_program* p;
        bpf_object__for_each_program(p, s->obj) {
            if (!wanted.count(bpf_program__name(p))) bpf_program__set_autoload(p, false);
        }
    }
    if (int err = mps_dp__load(s))
        fail("loading the BPF programs (the verifier's log is above)", err);
    dp->slots_ = &s->bss->mps_slots;
    // Both slots: no chain on any hook until a generation is written.
    for (auto& t : dp->slots_->tables)
        for (auto& e : t.entries) e = {MPS_PC_END, 0, 0};
    // Slot 0: the interpreter; slot N: the program of enum value N, for every one loaded.
    for (bool xdp : {true, false}) {
        const int jmp = bpf_map__fd(xdp ? s->maps.jmp_xdp : s->maps.jmp_tc);
        for (uint32_t slot = 0; slot < MPS_PROG_MAX; ++slot) {
            auto p = static_cast<mps_prog>(slot);
            if (slot != MPS_PROG_NONE && !has_program(p)) continue;
            std::string name = slot == MPS_PROG_NONE ? (xdp ? "interp_xdp" : "interp_tc")
                                                     : prog_for(p, xdp);
            auto* prog = bpf_object__find_program_by_name(s->obj, name.c_str());
            if (!prog || bpf_program__fd(prog) < 0) continue;  // not loaded (`only`)
            int fd = bpf_program__fd(prog);
            if (bpf_map_update_elem(jmp, &slot, &fd, BPF_ANY))
                fail("filling the prog array slot " + std::to_string(slot), errno);
        }
        // Where compiled entries hand packets they do not take (compiled_entry.cpp).
        for (Hook h : {Hook::xdp, Hook::tc_egress, Hook::tc_ingress}) {
            if ((h == Hook::xdp) != xdp) continue;
            for (bool preflight : {false, true}) {
                auto* prog = bpf_object__find_program_by_name(s->obj, entry_name(h, preflight));
                if (!prog || bpf_program__fd(prog) < 0) continue;
                int fd = bpf_program__fd(prog);
                uint32_t slot = (preflight ? MPS_JMP_PREFLIGHT : MPS_JMP_ENTRY) + uint32_t(h);
                if (bpf_map_update_elem(jmp, &slot, &fd, BPF_ANY))
                    fail("filling the prog array slot " + std::to_string(slot), errno);
            }
        }
    }
    return dp;
}

std::shared_ptr<Datapath> Datapath::adopt(const std::string& dir) {
    std::shared_ptr<Datapath> dp(new Datapath());
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        int fd = bpf_obj_get(e.path().c_str());
        if (fd < 0) fail("adopting " + e.path().string(), errno);
        dp->adopted_.emplace_back(e.path().filename().string(), Fd(fd));
    }
    if (ec) throw Error("reading " + dir + ": " + ec.message());
    int bss = -1;
    try {
        for (const char* n : kAlways) dp->prog_fd(n);
        for (const char* n : kPreflight) dp->prog_fd(n);
        for (const char* n : {"jmp_xdp", "jmp_tc", "step_counters", "gen_counters"}) dp->map_fd(n);
        bss = dp->map_fd("bss");
    } catch (const Error& e) {
        throw Error("adopting " + dir + ": incomplete (" + e.what() + ")");
    }
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(bss, &info, &len)) fail("inspecting the slots map", errno);
    if (info.value_size < sizeof(mps_slots))
        throw Error("adopting " + dir + ": its slots map is from another build");
    const size_t page = sysconf(_SC_PAGESIZE);
    dp->map_len_ = (info.value_size + page - 1) / page * page;
    void* m = mmap(nullptr, dp->map_len_, PROT_READ | PROT_WRITE, MAP_SHARED, bss, 0);
    if (m == MAP_FAILED) fail("mapping the slots", errno);
    dp->slots_ = static_cast<mps_slots*>(m);
    return dp;
}

Datapath::~Datapath() {
    if (skel_) mps_dp__destroy(skel_);
    if (map_len_) munmap(slots_, map_len_);
}

void Datapath::pin(const std::string& dir) const {
    if (!skel_) return;  // adopted: already pinned
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("creating " + dir + ": " + ec.message());
    bpf_program* p;
    bpf_object__for_each_program(p, skel_->obj) {
        if (bpf_program__fd(p) < 0) continue;
        if (int err = bpf_program__pin(p, (dir + "/" + bpf_program__name(p)).c_str()))
            fail("pinning " + std::string(bpf_program__name(p)), err);
    }
    // The prog arrays among them: a prog array is emptied when its last user reference goes.
    bpf_map* m;
    bpf_object__for_each_map(m, skel_->obj) {
        std::string name = bpf_map__name(m);
        if (kSharedMaps.count(name) || name.find(".rodata") != std::string::npos) continue;
        if (name.find(".bss") != std::string::npos) name = "bss";
        if (int err = bpf_map__pin(m, (dir + "/" + name).c_str())) fail("pinning " + name, err);
    }
}

int Datapath::entry_fd(Hook h) const { return prog_fd(entry_name(h, false)); }
int Datapath::preflight_fd(Hook h) const { return prog_fd(entry_name(h, true)); }

int Datapath::prog_fd(std::string_view name) const {
    if (skel_) {
        auto* p = bpf_object__find_program_by_name(skel_->obj, std::string(name).c_str());
        if (!p || bpf_program__fd(p) < 0) throw Error("no BPF program " + std::string(name));
        return bpf_program__fd(p);
    }
    for (const auto& [n, fd] : adopted_)
        if (n == name) return fd.get();
    throw Error("no BPF program " + std::string(name));
}

int Datapath::map_fd(std::string_view name) const {
    if (skel_) {
        auto* m = bpf_object__find_map_by_name(
            skel_->obj, name == "bss" ? ".bss" : std::string(name).c_str());
        if (!m) throw Error("no BPF map " + std::string(name));
        return bpf_map__fd(m);
    }
    for (const auto& [n, fd] : adopted_)
        if (n == name) return fd.get();
    throw Error("no BPF map " + std::string(name));
}

mps_table& Datapath::table(uint32_t slot) { return slots_->tables[slot & 1]; }

uint32_t Datapath::live_word() const { return __atomic_load_n(&slots_->active, __ATOMIC_ACQUIRE); }

uint32_t Datapath::active_slot() const { return live_word() & 1; }

uint32_t Datapath::next_live(uint32_t slot) {
    // Epochs only grow, also across agents adopting this datapath (they start from the word).
    epoch_ = std::max(epoch_, live_word() >> 1) + 1;
    return (slot & 1) | epoch_ << 1;
}

void Datapath::set_testing(uint32_t live) {
    __atomic_store_n(&slots_->testing, live, __ATOMIC_RELEASE);
}

void Datapath::set_staged(uint32_t slot) {
    __atomic_store_n(&slots_->staged, slot & 1, __ATOMIC_RELEASE);
}

void Datapath::activate(uint32_t live) {
    const uint32_t before = live_word();
    if (before == live) return;
    // Release: the slot's contents are visible before any packet can read the new index.
    __atomic_store_n(&slots_->active, live, __ATOMIC_RELEASE);
    if ((before ^ live) & 1) flipped_ = true;  // the other slot: packets may still run this one
}

void Datapath::quiesce(bool always) {
    if (!flipped_ && !always) return;
    // XDP and TC programs run inside RCU read-side sections; membarrier(GLOBAL) is
    // synchronize_rcu(), so every packet that read the old index has left its programs.
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0) {
        spdlog::warn("membarrier(GLOBAL) failed ({}): waiting 100 ms instead",
                     std::strerror(errno));
        usleep(100000);
    }
    flipped_ = false;
}

// ---- Generation --------------------------------------------------------------------------

namespace {
void check_or_throw(const ChainSet& chains) {
    if (auto problems = chains.check(); !problems.empty()) {
        std::string msg = "invalid chain set:";
        for (const auto& p : problems) msg += "\n  " + p;
        throw Error(msg);
    }
}

// The programs (XDP and TC variants) a step runs in; none for the inline ones.
std::vector<std::string> programs_of(const mps_step& st) {
    auto p = static_cast<mps_prog>(st.prog);
    if (!has_program(p)) return {};
    return {prog_for(p, true), prog_for(p, false)};
}
}  // namespace

std::unique_ptr<Generation> Generation::build(const ChainSet& chains, uint32_t number,
                                              const StateMaps& state,
                                              const std::vector<std::string>& also_load) {
    check_or_throw(chains);  // before the load: an invalid chain set costs no verification
    std::vector<std::string> only = also_load;
    for (const auto& st : chains.steps)
        for (auto& name : programs_of(st)) only.push_back(std::move(name));
    only.push_back(kAlways[0]);  // never empty: empty means every program
    auto g = stage(Datapath::load(state, only), chains, number);
    if (!g->missing_interfaces().empty())
        throw Error("interface " + g->missing_interfaces().front() + " not found");
    g->compile();
    g->activate();
    return g;
}

std::unique_ptr<Generation> Generation::stage(std::shared_ptr<Datapath> dp, const ChainSet& chains,
                                              uint32_t number) {
    check_or_throw(chains);
    // Every step's program must be loaded (a missing one is an error here, not a missed tail
    // call later).
    for (const auto& st : chains.steps)
        for (const auto& name : programs_of(st)) dp->prog_fd(name);
    // Resolve interface names now. A redirect target that does not exist (yet) leaves the
    // step inert (ifindex 0: the packet goes on) and is reported; the agent stages again when
    // the interface appears.
    std::vector<mps_step> steps = chains.steps;
    std::vector<std::string> missing;
    for (const auto& [pc, ifname] : chains.step_ifnames) {
        if (pc >= steps.size()) throw Error("interface parameter for a missing step");
        unsigned idx = if_nametoindex(ifname.c_str());
        if (!idx) missing.push_back(ifname);
        steps[pc].p.redirect.ifindex = idx;
    }
    std::vector<std::pair<mps_iface_key, __u16>> ifents;
    mps_entry entry[MPS_HOOK_MAX];
    for (uint32_t h = 0; h < MPS_HOOK_MAX; ++h) entry[h] = {MPS_PC_END, 0, number};
    const uint32_t slot = dp->active_slot() ^ 1;
    for (const auto& e : chains.entries) {
        auto h = static_cast<uint32_t>(e.hook);
        if (e.ifname.empty()) {
            entry[h].pc = e.pc;
        } else {
            entry[h].flags |= MPS_ENTRYF_PER_IFACE;
            ifents.push_back({{ifindex_of(e.ifname), static_cast<__u16>(h),
                               static_cast<__u16>(slot)},
                              static_cast<__u16>(e.pc)});
        }
    }

    // From here on the slot is ours: wait out packets that may still run it.
    dp->quiesce();
    const int ifent_fd = dp->map_fd("iface_entries");
    std::vector<mps_iface_key> stale;
    mps_iface_key k{}, next{};
    for (int r = bpf_map_get_next_key(ifent_fd, nullptr, &next); r == 0;
         r = bpf_map_get_next_key(ifent_fd, &k, &next)) {
        if (next.slot == slot) stale.push_back(next);
        k = next;
    }
    for (const auto& key : stale) bpf_map_delete_elem(ifent_fd, &key);
    for (const auto& [key, pc] : ifents)
        if (bpf_map_update_elem(ifent_fd, &key, &pc, BPF_ANY))
            fail("writing a per-interface entry", errno);
    zero_percpu(dp->map_fd("step_counters"), slot * MPS_MAX_STEPS, MPS_MAX_STEPS,
                sizeof(mps_step_counters));
    zero_percpu(dp->map_fd("gen_counters"), slot * MPS_GC_MAX, MPS_GC_MAX, sizeof(__u64));
    auto& t = dp->table(slot);
    std::memset(t.steps, 0, sizeof t.steps);
    std::copy(steps.begin(), steps.end(), t.steps);
    std::copy(std::begin(entry), std::end(entry), t.entries);
    dp->set_staged(slot);

    std::unique_ptr<Generation> g(new Generation());
    g->live_ = dp->next_live(slot);
    g->dp_ = std::move(dp);
    g->slot_ = slot;
    g->number_ = number;
    g->chains_ = chains;
    g->missing_ = std::move(missing);
    return g;
}

std::unique_ptr<Generation> Generation::adopt(std::shared_ptr<Datapath> dp, uint32_t slot,
                                              const ChainSet& chains, uint32_t number) {
    std::unique_ptr<Generation> g(new Generation());
    // Running already: keep its word, so the entries the links hold stay live. Otherwise (the
    // flip back after a kill) a new one: entries compiled for the other run must not run.
    const uint32_t live = dp->live_word();
    g->live_ = (live & 1) == (slot & 1) ? live : dp->next_live(slot);
    g->dp_ = std::move(dp);
    g->slot_ = slot & 1;
    g->number_ = number;
    g->chains_ = chains;
    return g;
}

Generation::~Generation() = default;

void Generation::activate() { dp_->activate(live_); }

void Generation::write_step(uint32_t pc, const mps_step& step) {
    if (pc >= chains_.steps.size()) throw Error("no step " + std::to_string(pc));
    for (const auto& name : programs_of(step)) dp_->prog_fd(name);
    // Compiled entries hold inline steps whole, and of program steps what runs next.
    const mps_step& old = chains_.steps[pc];
    const bool recompile =
        !compiled_.empty() &&
        (old.prog != step.prog || old.on_match != step.on_match || old.on_miss != step.on_miss ||
         old.flags != step.flags ||
         (!has_program(static_cast<mps_prog>(step.prog)) && std::memcmp(&old.p, &step.p, sizeof step.p)));
    if (recompile) {
        const bool was_active = dp_->live_word() == live_;
        live_ = dp_->next_live(slot_);
        if (was_active) dp_->activate(live_);  // the old entries hand everything on from now
    }
    auto& dst = dp_->table(slot_).steps[pc];
    // Parameters first, the program byte last: a packet sees the old step or the new one
    // for the fields that decide what runs.
    std::memcpy(&dst.p, &step.p, sizeof step.p);
    dst.on_match = step.on_match;
    dst.on_miss = step.on_miss;
    dst.policy = step.policy;
    dst.flags = step.flags;
    __atomic_store_n(&dst.prog, step.prog, __ATOMIC_RELEASE);
    chains_.steps[pc] = step;
    if (recompile) compile();
}

// ---- compiled entries (compiled_entry.cpp) -----------------------------------------------

struct Generation::Compiled {
    Hook hook;
    uint16_t first;  // the chain's first pc in the table
    Fd prog;
    int fd() const { return prog.get(); }
};

namespace {
Fd load_compiled(Hook hook, const std::vector<bpf_insn>& insns, const std::string& what) {
    const bool xdp = hook == Hook::xdp;
    const auto type = xdp ? BPF_PROG_TYPE_XDP : BPF_PROG_TYPE_SCHED_CLS;
    const char* name = xdp ? "fast_xdp" : "fast_tc";
    // The attach type libbpf gives SEC("xdp") / SEC("tc"): the prog arrays take only
    // programs like their owner, the datapath's entry.
    LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = xdp ? BPF_XDP : bpf_attach_type(0));
    int fd = bpf_prog_load(type, name, "Dual BSD/GPL", insns.data(), insns.size(), &opts);
    if (fd >= 0) return Fd(fd);
    const int err = errno;
    std::string log(1 << 22, '\0');  // again, with the verifier's log
    opts.log_buf = log.data();
    opts.log_size = static_cast<__u32>(log.size());
    opts.log_level = 1;
    Fd again(bpf_prog_load(type, name, "Dual BSD/GPL", insns.data(), insns.size(), &opts));
    log.resize(std::strlen(log.c_str()));
    if (log.size() > 3000) log = "..." + log.substr(log.size() - 3000);
    throw Error(what + ": " + std::strerror(err) + "; the verifier said:\n" + log);
}
}  // namespace

uint16_t Generation::first_pc(Hook h, const std::string& ifname) const {
    uint16_t pc = MPS_PC_END;
    for (const auto& e : chains_.entries) {
        if (e.hook != h) continue;
        if (!ifname.empty() && e.ifname == ifname) return e.pc;
        if (e.ifname.empty()) pc = e.pc;
    }
    return pc;
}

void Generation::compile() {
    std::vector<std::unique_ptr<Compiled>> out;
    std::set<std::pair<Hook, uint16_t>> chains;
    for (const auto& e : chains_.entries)
        if (e.pc != MPS_PC_END) chains.insert({e.hook, e.pc});
    for (auto [hook, first] : chains) {
        const EntryMaps maps{dp_->map_fd("bss"), dp_->map_fd(hook == Hook::xdp ? "jmp_xdp" : "jmp_tc"),
                             dp_->map_fd("step_counters"), dp_->map_fd("gen_counters")};
        auto insns = emit_entry(chains_.steps, first, hook, live_, maps);
        if (!insns) {
            spdlog::debug("{} chain at pc {}: not compiled (the entry program runs it)",
                          to_string(hook), first);
            continue;
        }
        auto c = std::make_unique<Compiled>();
        c->hook = hook;
        c->first = first;
        c->prog = load_compiled(hook, *insns,
                                "loading the compiled entry for the " + std::string(to_string(hook)) +
                                    " chain at pc " + std::to_string(first));
        out.push_back(std::move(c));
    }
    compiled_ = std::move(out);
}

int Generation::entry_fd(Hook h, const std::string& ifname) const {
    const uint16_t first = first_pc(h, ifname);
    for (const auto& c : compiled_)
        if (c->hook == h && c->first == first) return c->fd();
    return dp_->entry_fd(h);
}

bool Generation::compiled(Hook h, const std::string& ifname) const {
    return entry_fd(h, ifname) != dp_->entry_fd(h);
}

std::vector<std::pair<Hook, RunResult>> Generation::preflight(std::span<const uint8_t> frame) const {
    std::vector<std::pair<Hook, RunResult>> out;
    for (Hook h : {Hook::xdp, Hook::tc_egress, Hook::tc_ingress})
        out.emplace_back(h, test_run(dp_->preflight_fd(h), frame, h == Hook::xdp));
    struct Testing {  // compiled entries run their chain while testing holds their word
        Datapath& dp;
        ~Testing() { dp.set_testing(0); }
    } testing{*dp_};
    dp_->set_testing(live_);
    for (const auto& c : compiled_)
        out.emplace_back(c->hook, test_run(c->fd(), frame, c->hook == Hook::xdp));
    return out;
}

std::vector<StepCounters> Generation::step_counters() const {
    std::vector<StepCounters> out(chains_.steps.size());
    const int fd = dp_->map_fd("step_counters");
    for (uint32_t pc = 0; pc < out.size(); ++pc)
        for (const auto& c : read_percpu<mps_step_counters>(fd, slot_ * MPS_MAX_STEPS + pc)) {
            out[pc].runs += c.runs;
            out[pc].matched += c.matched;
            out[pc].drops += c.drops;
            out[pc].missed_tail_calls += c.missed_tail_calls;
        }
    return out;
}

GenCounters Generation::gen_counters() const {
    GenCounters out;
    const int fd = dp_->map_fd("gen_counters");
    for (uint32_t i = 0; i < MPS_GC_MAX; ++i)
        for (auto v : read_percpu<uint64_t>(fd, slot_ * MPS_GC_MAX + i)) out.values[i] += v;
    return out;
}

// ---- test run ----------------------------------------------------------------------------

RunResult test_run(int prog_fd, std::span<const uint8_t> frame, bool xdp, uint32_t repeat,
                   uint32_t ifindex) {
    RunResult r;
    r.out.resize(frame.size() + 512);
    __sk_buff skb_ctx{};
    xdp_md xdp_in{}, xdp_out{};
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = r.out.data(),
                .data_size_in = static_cast<__u32>(frame.size()),
                .data_size_out = static_cast<__u32>(r.out.size()),
                .repeat = static_cast<int>(repeat));
    if (xdp) {
        // The kernel copies out from data_meta; ctx_out.data says where the frame starts.
        xdp_in.data_end = static_cast<__u32>(frame.size());
        opts.ctx_in = &xdp_in;
        opts.ctx_size_in = sizeof xdp_in;
        opts.ctx_out = &xdp_out;
        opts.ctx_size_out = sizeof xdp_out;
    } else if (ifindex) {
        skb_ctx.ifindex = ifindex;
        opts.ctx_in = &skb_ctx;
        opts.ctx_size_in = sizeof skb_ctx;
    }
    if (bpf_prog_test_run_opts(prog_fd, &opts)) fail("BPF_PROG_TEST_RUN", errno);
    r.retval = opts.retval;
    r.duration_ns = opts.duration;
    r.out.resize(opts.data_size_out);
    if (xdp && xdp_out.data > 0 && xdp_out.data <= r.out.size())
        r.out.erase(r.out.begin(), r.out.begin() + xdp_out.data);
    return r;
}

// ---- attachments -------------------------------------------------------------------------

std::unique_ptr<HookLink> HookLink::attach(const std::string& ifname, Hook hook, int prog_fd) {
    std::unique_ptr<HookLink> l(new HookLink());
    l->ifname_ = ifname;
    l->hook_ = hook;
    l->ifindex_ = static_cast<int>(ifindex_of(ifname));
    l->prog_fd_ = prog_fd;
    if (hook == Hook::xdp) {
        // Native first (fast path), generic where the driver has no XDP support.
        for (auto [flags, mode] : {std::pair{XDP_FLAGS_DRV_MODE, "xdp-native"},
                                   std::pair{XDP_FLAGS_SKB_MODE, "xdp-generic"}}) {
            LIBBPF_OPTS(bpf_link_create_opts, opts, .flags = flags);
            int fd = bpf_link_create(prog_fd, l->ifindex_, BPF_XDP, &opts);
            if (fd >= 0) {
                l->link_ = Fd(fd);
                l->mode_ = mode;
                return l;
            }
            spdlog::debug("{}: {} attach failed: {}", ifname, mode, std::strerror(errno));
        }
        fail("attaching XDP to " + ifname, errno);
    }
    const bool egress = hook == Hook::tc_egress;
    int fd = bpf_link_create(prog_fd, l->ifindex_,
                             static_cast<bpf_attach_type>(egress ? kAttachTcxEgress
                                                                 : kAttachTcxIngress),
                             nullptr);
    if (fd >= 0) {
        l->link_ = Fd(fd);
        l->mode_ = "tcx";
        return l;
    }
    spdlog::debug("{}: TCX unavailable ({}), using a clsact filter", ifname, std::strerror(errno));
    LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = l->ifindex_,
                .attach_point = egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
    if (int err = bpf_tc_hook_create(&th); err && err != -EEXIST)
        fail("creating clsact on " + ifname, err);
    LIBBPF_OPTS(bpf_tc_opts, to, .prog_fd = prog_fd, .handle = kTcHandle,
                .priority = kTcPriority);
    if (int err = bpf_tc_attach(&th, &to)) fail("attaching TC to " + ifname, err);
    l->mode_ = "tc-filter";
    return l;
}

std::unique_ptr<HookLink> HookLink::adopt(const std::string& pin_path, const std::string& ifname,
                                          Hook hook, int prog_fd) {
    std::unique_ptr<HookLink> l(new HookLink());
    l->ifname_ = ifname;
    l->hook_ = hook;
    l->pin_path_ = pin_path;
    l->prog_fd_ = prog_fd;
    int fd = bpf_obj_get(pin_path.c_str());
    if (fd < 0) fail("adopting link " + pin_path, errno);
    l->link_ = Fd(fd);
    l->mode_ = hook == Hook::xdp ? "xdp" : "tcx";
    unsigned idx = if_nametoindex(ifname.c_str());
    l->ifindex_ = static_cast<int>(idx);
    return l;
}

HookLink::~HookLink() {
    if (released_ || link_) return;  // closing an unpinned link fd detaches it
    LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = ifindex_,
                .attach_point = hook_ == Hook::tc_egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
    LIBBPF_OPTS(bpf_tc_opts, to, .handle = kTcHandle, .priority = kTcPriority);
    bpf_tc_detach(&th, &to);
}

void HookLink::update(int new_prog_fd, bool expect_current) {
    if (link_) {
        // BPF_F_REPLACE: fails instead of clobbering if someone else swapped the program.
        LIBBPF_OPTS(bpf_link_update_opts, opts);
        if (expect_current) {
            opts.flags = BPF_F_REPLACE;
            opts.old_prog_fd = static_cast<__u32>(prog_fd_);
        }
        if (bpf_link_update(link_.get(), new_prog_fd, &opts))
            fail("swapping the program on " + ifname_ + " " + std::string(to_string(hook_)),
                 errno);
    } else {
        LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = ifindex_,
                    .attach_point = hook_ == Hook::tc_egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
        LIBBPF_OPTS(bpf_tc_opts, to, .prog_fd = new_prog_fd, .flags = BPF_TC_F_REPLACE,
                    .handle = kTcHandle, .priority = kTcPriority);
        if (int err = bpf_tc_attach(&th, &to)) fail("replacing the TC program on " + ifname_, err);
    }
    prog_fd_ = new_prog_fd;
}

void HookLink::pin(const std::string& path) {
    if (!link_) return;  // clsact filters stay until removed
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    unlink(path.c_str());  // a stale pin of a link that is gone
    if (bpf_obj_pin(link_.get(), path.c_str())) fail("pinning link " + path, errno);
    pin_path_ = path;
}

void HookLink::detach() {
    if (!pin_path_.empty()) unlink(pin_path_.c_str());
    if (link_) {
        bpf_link_detach(link_.get());
        link_ = Fd();
    } else {
        LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = ifindex_,
                    .attach_point = hook_ == Hook::tc_egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
        LIBBPF_OPTS(bpf_tc_opts, to, .handle = kTcHandle, .priority = kTcPriority);
        bpf_tc_detach(&th, &to);
    }
    released_ = true;
}

// ---- events ------------------------------------------------------------------------------

MptcpKeyIds mptcp_key_ids(uint64_t key_wire) {
    // The key as on the wire is already big-endian bytes in memory. One digest gives both.
    unsigned char h[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(&key_wire), sizeof key_wire, h);
    MptcpKeyIds ids;
    ids.token = uint32_t(h[0]) << 24 | uint32_t(h[1]) << 16 | uint32_t(h[2]) << 8 | h[3];
    for (int i = 24; i < 32; ++i) ids.idsn = ids.idsn << 8 | h[i];
    return ids;
}

namespace {
// What ctl_flow_update (bpf/ctl.bpf.c) has just written into the flow entry, applied to the
// reader's copy of it, so the copy handed on with the event is the entry as it is now.
void mirror_update(mps_flow& f, const mps_ctl_flow_req& r) {
    for (int i = 0; i < 2; ++i) {
        if ((r.set & MPS_CTL_TOKENS) && r.token[i]) f.token[i] = r.token[i];
        if ((r.set & MPS_CTL_IDSN) && r.idsn[i]) f.idsn[i] = r.idsn[i];
    }
    if (r.set & MPS_CTL_CONN) f.conn_token = r.conn_token;
}
}  // namespace

EventReader::EventReader(const StateMaps& state, Handler handler)
    : state_(state), handler_(std::move(handler)) {
    rb_ = ring_buffer__new(state.events(), &EventReader::on_sample, this, nullptr);
    if (!rb_) fail("opening the event ring buffer", errno);
}

EventReader::~EventReader() { ring_buffer__free(rb_); }

int EventReader::fd() const { return ring_buffer__epoll_fd(rb_); }

int EventReader::poll(std::chrono::milliseconds timeout) {
    int n = ring_buffer__poll(rb_, static_cast<int>(timeout.count()));
    if (n < 0 && n != -EINTR) fail("polling events", n);
    return n < 0 ? 0 : n;
}

int EventReader::consume() {
    int n = ring_buffer__consume(rb_);
    if (n < 0) fail("consuming events", n);
    return n;
}

// Tokens from keys: write them where the datapath looks (flow fields through the control
// program, a connection entry created once), never rewriting what the datapath counts.
int EventReader::on_sample(void* self_ptr, void* data, size_t size) {
    auto* self = static_cast<EventReader*>(self_ptr);
    if (size < sizeof(mps_event)) return 0;
    Event ev{};
    std::memcpy(&ev.raw, data, sizeof ev.raw);
    const auto& r = ev.raw;
    const auto& state = self->state_;
    mps_flow& f = ev.flow;
    ev.have_flow = bpf_map_lookup_elem(state.flows(), &r.flow, &f) == 0;
    const bool have_flow = ev.have_flow;
    mps_ctl_flow_req req{};
    req.key = r.flow;
    if (r.type == MPS_EV_MP_CAPABLE) {
        // key[0] is the sender's key, key[1] (third ACK only) the receiver's.
        const int sender = r.from_a ? 0 : 1;
        uint64_t keys[2] = {0, 0};
        keys[sender] = r.key[0];
        keys[sender ^ 1] = r.key[1];
        for (int i = 0; i < 2; ++i)  // keys may have arrived in separate packets
            if (!keys[i] && have_flow) keys[i] = f.key[i];
        uint32_t tok[2] = {0, 0};
        for (int i = 0; i < 2; ++i) {
            if (!keys[i]) continue;
            const auto ids = mptcp_key_ids(keys[i]);
            tok[i] = ids.token;
            req.token[i] = ids.token;
            req.idsn[i] = ids.idsn;
        }
        ev.token_a = tok[0];
        ev.token_b = tok[1];
        req.set = MPS_CTL_TOKENS | MPS_CTL_IDSN;
        if (tok[0] && tok[1]) {
            mps_conn c{};
            c.token[0] = std::min(tok[0], tok[1]);
            c.token[1] = std::max(tok[0], tok[1]);
            c.subflows = 1;
            bpf_map_update_elem(state.conns(), &c.token[0], &c, BPF_NOEXIST);
            mps_conn alias{};
            alias.token[0] = c.token[0];
            alias.token[1] = c.token[1];
            bpf_map_update_elem(state.conns(), &c.token[1], &alias, BPF_NOEXIST);
            req.conn_token = c.token[0];
            req.set |= MPS_CTL_CONN;
        }
        if (have_flow) {
            ev.have_flow = state.update_flow(req);  // false: the entry went meanwhile
            if (ev.have_flow) mirror_update(f, req);
        }
    } else if (r.type == MPS_EV_MP_JOIN && have_flow) {
        // The token names the receiver's side; the connection entry gives the other one.
        mps_conn c{};
        bool found = bpf_map_lookup_elem(state.conns(), &r.token, &c) == 0;
        if (found) {
            const int receiver = r.from_a ? 1 : 0;
            req.token[receiver] = r.token;
            req.token[receiver ^ 1] = c.token[0] == r.token ? c.token[1] : c.token[0];
            req.conn_token = c.token[0];
            req.set = MPS_CTL_TOKENS | MPS_CTL_CONN;
            // The datapath counts the subflow itself when the connection entry existed at
            // the MP_JOIN SYN (then it linked the flow already); otherwise count it here.
            if (f.conn_token != c.token[0]) req.set |= MPS_CTL_SUBFLOW;
            ev.have_flow = state.update_flow(req);
            if (ev.have_flow) mirror_update(f, req);
        }
    }
    self->handler_(ev);
    return 0;
}

}  // namespace mpsteer::datapath
