#include "datapath/datapath.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <filesystem>
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

// ---- Generation --------------------------------------------------------------------------

std::unique_ptr<Generation> Generation::build(const ChainSet& chains, uint32_t number,
                                              const StateMaps& state,
                                              const std::vector<std::string>& also_load) {
    if (auto problems = chains.check(); !problems.empty()) {
        std::string msg = "invalid chain set:";
        for (const auto& p : problems) msg += "\n  " + p;
        throw Error(msg);
    }
    std::unique_ptr<Generation> g(new Generation());
    g->number_ = number;
    g->chains_ = chains;
    g->skel_ = mps_dp__open();
    if (!g->skel_) fail("opening the BPF object", errno);
    auto* s = g->skel_;
    // Shared state first, so every generation sees the same flows.
    if (int err = bpf_map__reuse_fd(s->maps.flows, state.flows())) fail("reusing flows", err);
    if (int err = bpf_map__reuse_fd(s->maps.conns, state.conns())) fail("reusing conns", err);
    if (int err = bpf_map__reuse_fd(s->maps.events, state.events())) fail("reusing events", err);
    if (int err = bpf_map__reuse_fd(s->maps.announces, state.announces()))
        fail("reusing announces", err);
    if (int err = bpf_map__reuse_fd(s->maps.add_requests, state.add_requests()))
        fail("reusing add_requests", err);
    if (int err = bpf_map__reuse_fd(s->maps.prio_sent, state.prio_sent()))
        fail("reusing prio_sent", err);
    std::set<std::string> wanted(also_load.begin(), also_load.end());
    for (const char* always : {"entry_xdp", "entry_tc_egress", "entry_tc_ingress", "interp_xdp",
                               "interp_tc"})
        wanted.insert(always);
    for (const auto& st : chains.steps)
        if (has_program(static_cast<mps_prog>(st.prog)))
            for (bool xdp : {true, false}) wanted.insert(prog_for(static_cast<mps_prog>(st.prog), xdp));
    bpf_program* p;
    bpf_object__for_each_program(p, s->obj) {
        if (!wanted.count(bpf_program__name(p))) bpf_program__set_autoload(p, false);
    }
    if (int err = mps_dp__load(s))
        fail("loading the BPF programs (the verifier's log is above)", err);

    // Resolve interface names now: a missing interface fails the build, not the packets.
    std::vector<mps_step> steps = chains.steps;
    for (const auto& [pc, ifname] : chains.step_ifnames) {
        if (pc >= steps.size()) throw Error("interface parameter for a missing step");
        steps[pc].p.redirect.ifindex = ifindex_of(ifname);
    }
    const int steps_fd = bpf_map__fd(s->maps.steps);
    for (uint32_t pc = 0; pc < steps.size(); ++pc)
        if (bpf_map_update_elem(steps_fd, &pc, &steps[pc], BPF_ANY))
            fail("writing step " + std::to_string(pc), errno);
    // Slot 0: the interpreter; slot N: the program of enum value N for the steps that have
    // one (a missing one is a load error here, not a missed tail call later).
    std::set<mps_prog> actors;
    for (const auto& st : steps)
        if (has_program(static_cast<mps_prog>(st.prog)))
            actors.insert(static_cast<mps_prog>(st.prog));
    for (bool xdp : {true, false}) {
        const int jmp = bpf_map__fd(xdp ? s->maps.jmp_xdp : s->maps.jmp_tc);
        auto put_slot = [&](uint32_t slot, const std::string& name) {
            auto* p = bpf_object__find_program_by_name(s->obj, name.c_str());
            if (!p) throw Error("no BPF program " + name + " (not implemented yet?)");
            int fd = bpf_program__fd(p);
            if (bpf_map_update_elem(jmp, &slot, &fd, BPF_ANY))
                fail("filling the prog array slot " + std::to_string(slot), errno);
        };
        put_slot(MPS_PROG_NONE, xdp ? "interp_xdp" : "interp_tc");
        for (auto a : actors) put_slot(a, prog_for(a, xdp));
    }
    mps_entry entry[MPS_HOOK_MAX];
    for (uint32_t h = 0; h < MPS_HOOK_MAX; ++h) entry[h] = {MPS_PC_END, 0, number};
    const int ifent_fd = bpf_map__fd(s->maps.iface_entries);
    for (const auto& e : chains.entries) {
        auto h = static_cast<uint32_t>(e.hook);
        if (e.ifname.empty()) {
            entry[h].pc = e.pc;
        } else {
            entry[h].flags |= MPS_ENTRYF_PER_IFACE;
            mps_iface_key k{ifindex_of(e.ifname), h};
            __u16 pc = e.pc;
            if (bpf_map_update_elem(ifent_fd, &k, &pc, BPF_ANY))
                fail("writing the entry for " + e.ifname, errno);
        }
    }
    const int ent_fd = bpf_map__fd(s->maps.entries);
    for (uint32_t h = 0; h < MPS_HOOK_MAX; ++h)
        if (bpf_map_update_elem(ent_fd, &h, &entry[h], BPF_ANY)) fail("writing entries", errno);
    return g;
}

Generation::~Generation() {
    if (skel_) mps_dp__destroy(skel_);
}

std::unique_ptr<Generation> Generation::adopt(const std::string& dir, const ChainSet& chains,
                                              uint32_t number) {
    std::unique_ptr<Generation> g(new Generation());
    g->number_ = number;
    g->chains_ = chains;
    for (const char* name : {"entry_xdp", "entry_tc_egress", "entry_tc_ingress", "step_counters",
                             "gen_counters"}) {
        int fd = bpf_obj_get((dir + "/" + name).c_str());
        if (fd < 0) fail("adopting " + dir + "/" + name, errno);
        g->adopted_.emplace_back(fd);
    }
    return g;
}

int Generation::entry_fd(Hook h) const {
    if (!skel_) return adopted_[static_cast<size_t>(h)].get();
    switch (h) {
    case Hook::xdp: return bpf_program__fd(skel_->progs.entry_xdp);
    case Hook::tc_egress: return bpf_program__fd(skel_->progs.entry_tc_egress);
    case Hook::tc_ingress: return bpf_program__fd(skel_->progs.entry_tc_ingress);
    }
    return -1;
}

int Generation::prog_fd(std::string_view name) const {
    if (!skel_) throw Error("an adopted generation has only its entry programs");
    auto* p = bpf_object__find_program_by_name(skel_->obj, std::string(name).c_str());
    if (!p) throw Error("no BPF program " + std::string(name));
    return bpf_program__fd(p);
}

int Generation::map_fd(std::string_view name) const {
    if (!skel_) throw Error("an adopted generation has only its counters");
    auto* m = bpf_object__find_map_by_name(skel_->obj, std::string(name).c_str());
    if (!m) throw Error("no BPF map " + std::string(name));
    return bpf_map__fd(m);
}

namespace {
// Per-CPU values are laid out at 8-byte strides, one per possible CPU.
template <typename T>
std::vector<T> read_percpu(int fd, uint32_t key) {
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu <= 0) fail("counting CPUs", ncpu);
    std::vector<T> vals(ncpu);
    static_assert(sizeof(T) % 8 == 0);
    if (bpf_map_lookup_elem(fd, &key, vals.data())) fail("reading counters", errno);
    return vals;
}
}  // namespace

std::vector<StepCounters> Generation::step_counters() const {
    std::vector<StepCounters> out(chains_.steps.size());
    const int fd = skel_ ? bpf_map__fd(skel_->maps.step_counters) : adopted_[3].get();
    for (uint32_t pc = 0; pc < out.size(); ++pc)
        for (const auto& c : read_percpu<mps_step_counters>(fd, pc)) {
            out[pc].runs += c.runs;
            out[pc].matched += c.matched;
            out[pc].drops += c.drops;
            out[pc].missed_tail_calls += c.missed_tail_calls;
        }
    return out;
}

GenCounters Generation::gen_counters() const {
    GenCounters out;
    const int fd = skel_ ? bpf_map__fd(skel_->maps.gen_counters) : adopted_[4].get();
    for (uint32_t i = 0; i < MPS_GC_MAX; ++i)
        for (auto v : read_percpu<uint64_t>(fd, i)) out.values[i] += v;
    return out;
}

void Generation::pin(const std::string& dir) const {
    if (!skel_) return;  // adopted: already pinned
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("creating " + dir + ": " + ec.message());
    for (auto* p : {skel_->progs.entry_xdp, skel_->progs.entry_tc_egress,
                    skel_->progs.entry_tc_ingress})
        if (int err = bpf_program__pin(p, (dir + "/" + bpf_program__name(p)).c_str()))
            fail("pinning " + std::string(bpf_program__name(p)), err);
    // Pinning the prog arrays keeps the chain alive while anything still runs it.
    for (auto* m : {skel_->maps.jmp_xdp, skel_->maps.jmp_tc, skel_->maps.steps,
                    skel_->maps.entries, skel_->maps.step_counters, skel_->maps.gen_counters})
        if (int err = bpf_map__pin(m, (dir + "/" + bpf_map__name(m)).c_str()))
            fail("pinning " + std::string(bpf_map__name(m)), err);
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

namespace {
void sha256_key(uint64_t key_wire, unsigned char out[SHA256_DIGEST_LENGTH]) {
    // The key as on the wire is already big-endian bytes in memory.
    SHA256(reinterpret_cast<const unsigned char*>(&key_wire), sizeof key_wire, out);
}
}  // namespace

uint32_t mptcp_token(uint64_t key_wire) {
    unsigned char h[SHA256_DIGEST_LENGTH];
    sha256_key(key_wire, h);
    return uint32_t(h[0]) << 24 | uint32_t(h[1]) << 16 | uint32_t(h[2]) << 8 | h[3];
}

uint64_t mptcp_idsn(uint64_t key_wire) {
    unsigned char h[SHA256_DIGEST_LENGTH];
    sha256_key(key_wire, h);
    uint64_t v = 0;
    for (int i = 24; i < 32; ++i) v = v << 8 | h[i];
    return v;
}

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

// Tokens from keys: write them where the datapath looks (flow fields through the control
// program, a connection entry created once), never rewriting what the datapath counts.
int EventReader::on_sample(void* self_ptr, void* data, size_t size) {
    auto* self = static_cast<EventReader*>(self_ptr);
    if (size < sizeof(mps_event)) return 0;
    Event ev{};
    std::memcpy(&ev.raw, data, sizeof ev.raw);
    const auto& r = ev.raw;
    const auto& state = self->state_;
    mps_flow f{};
    const bool have_flow = bpf_map_lookup_elem(state.flows(), &r.flow, &f) == 0;
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
            tok[i] = mptcp_token(keys[i]);
            req.token[i] = tok[i];
            req.idsn[i] = mptcp_idsn(keys[i]);
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
        if (have_flow) state.update_flow(req);
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
            state.update_flow(req);
        }
    }
    self->handler_(ev);
    return 0;
}

}  // namespace mpsteer::datapath
