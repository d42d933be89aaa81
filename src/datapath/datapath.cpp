// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The loaded datapath (Datapath): the BPF object loaded once with the shared state maps, its
// prog arrays filled, its pins and their adoption by a later agent, and the two table slots
// with the live word that generations are switched by (bpf/README.md, "Generations").
#include "datapath/internal.h"
#include "datapath/kernel_probe.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/membarrier.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>

#include "mps_dp.skel.h"
#include "mps_dp_nobtf.skel.h"
#include "net/sha256.h"

namespace fs = std::filesystem;

namespace mpsteer::datapath {

using detail::entry_name;
using detail::fail;
using detail::kAlwaysLoaded;
using detail::kPreflightEntries;

const char* detail::entry_name(Hook h, bool preflight) {
    switch (h) {
    case Hook::xdp: return preflight ? "preflight_xdp" : "entry_xdp";
    case Hook::tc_egress: return preflight ? "preflight_tc_egress" : "entry_tc_egress";
    case Hook::tc_ingress: return preflight ? "preflight_tc_ingress" : "entry_tc_ingress";
    }
    return "";
}

namespace {

// The datapath object for this kernel (why_datapath_without_btf()): libbpf refuses a whole
// object with CO-RE relocations on a kernel without BTF, and an interpreter refuses programs
// that make subprogram calls and tail calls. Both builds have the programs and maps mps_dp's
// skeleton names (the one without BTF has more), so that skeleton binds either.
const void* object_bytes(size_t* size) {
    return why_datapath_without_btf().empty() ? mps_dp__elf_bytes(size)
                                              : mps_dp_nobtf__elf_bytes(size);
}

DpSkeleton open_object() {
    DpSkeleton obj(static_cast<mps_dp*>(calloc(1, sizeof(mps_dp))));
    if (!obj || mps_dp__create_skeleton(obj.get())) return nullptr;
    obj->skeleton->data = const_cast<void*>(object_bytes(&obj->skeleton->data_sz));
    if (bpf_object__open_skeleton(obj->skeleton, nullptr)) return nullptr;
    return obj;
}

}  // namespace

std::string Datapath::object_id() {
    static const std::string id = [] {  // the object is part of the binary: hash it once
        size_t size = 0;
        const void* bytes = object_bytes(&size);
        const auto h = net::sha256(bytes, size);
        char hex[13];
        for (int i = 0; i < 6; ++i) std::snprintf(hex + 2 * i, 3, "%02x", h[i]);
        return std::string(hex);
    }();
    return id;
}

std::shared_ptr<Datapath> Datapath::load(const StateMaps& state,
                                         const std::vector<std::string>& only) {
    std::shared_ptr<Datapath> dp(new Datapath());
    dp->skel_ = open_object();
    if (!dp->skel_) fail("opening the BPF object", errno);
    auto* s = dp->skel_.get();
    // Shared state first, so every datapath sees the same flows.
    detail::reuse_state_maps(s->obj, state);
    // set_backup's templates: one per subflow direction it signalled, like prio_sent.
    if (int err = bpf_map__set_max_entries(s->maps.prio_tmpl, state.sizes().prio_sent()))
        fail("sizing prio_tmpl", err);
    {
        std::set<std::string> wanted(only.begin(), only.end());
        wanted.insert(std::begin(kAlwaysLoaded), std::end(kAlwaysLoaded));
        wanted.insert({"opt_walk_xdp", "opt_walk_tc"});  // in the build without kernel BTF
        bpf_program* p;
        bpf_object__for_each_program(p, s->obj) {
            const std::string_view name = bpf_program__name(p);
            // The benchmark's yardsticks load only when named: a node never runs them.
            const bool off =
                only.empty() ? name.starts_with("bench_") : !wanted.count(std::string(name));
            if (off) bpf_program__set_autoload(p, false);
        }
    }
    detail::forget_refusal();
    if (int err = mps_dp__load(s)) {
        const auto why = detail::last_refusal();
        // The kernel feature behind the one verdict a whole class of kernels gives.
        if (why.verdict.find("tail_calls are not allowed in non-JITed programs") !=
            std::string::npos)
            fail(
                "loading the BPF programs: this kernel interprets them (its JIT is off or "
                "compiles no subprogram calls), and its interpreter refuses tail calls from "
                "programs with subprogram calls; MPSTEER_DATAPATH_WITHOUT_BTF=1 picks the "
                "build without them",
                err);
        fail(
            "loading the BPF programs" +
                (why.program.empty() ? std::string()
                                     : " (this kernel's verifier refused program " + why.program +
                                           ": " + why.verdict + "; the whole log with mpsteer -v)"),
            err);
    }
    dp->slots_ = &s->bss->mps_slots;
    dp->empty_slots();
    dp->fill_prog_arrays();
    return dp;
}

void Datapath::empty_slots() {
    // Both slots: no chain on any hook until a generation is written.
    for (auto& t : slots_->tables)
        for (auto& e : t.entries) e = {MPS_PC_END, 0, 0};
}

void Datapath::fill_prog_arrays() const {
    auto* s = skel_.get();
    // Slot 0: the interpreter; slot N: the program of enum value N, for every one loaded.
    // Built without kernel BTF, the option walk is a program of its own (bpf/datapath.bpf.c,
    // opt_walk_*): slot N holds it for a step that reads options, and it hands the packet on
    // to the step through step_progs_* (the entry program sends SYNs to MPS_JMP_OPT_WALK).
    auto set_slot = [](int map, uint32_t slot, int fd) {
        if (bpf_map_update_elem(map, &slot, &fd, BPF_ANY))
            fail("filling the prog array slot " + std::to_string(slot), errno);
    };
    for (bool xdp : {true, false}) {
        const int jmp = bpf_map__fd(xdp ? s->maps.jmp_xdp : s->maps.jmp_tc);
        auto* walk = bpf_object__find_program_by_name(s->obj, xdp ? "opt_walk_xdp" : "opt_walk_tc");
        auto* steps =
            bpf_object__find_map_by_name(s->obj, xdp ? "step_progs_xdp" : "step_progs_tc");
        const int walk_fd = walk && steps ? bpf_program__fd(walk) : -1;
        if (walk_fd >= 0) set_slot(jmp, MPS_JMP_OPT_WALK, walk_fd);
        for (uint32_t slot = 0; slot < MPS_PROG_MAX; ++slot) {
            auto p = static_cast<mps_prog>(slot);
            if (slot != MPS_PROG_NONE && !has_program(p)) continue;
            std::string name = slot == MPS_PROG_NONE ? (xdp ? "interp_xdp" : "interp_tc")
                                                     : detail::program_name(p, xdp);
            auto* prog = bpf_object__find_program_by_name(s->obj, name.c_str());
            if (!prog || bpf_program__fd(prog) < 0) continue;  // not loaded (`only`)
            int fd = bpf_program__fd(prog);
            if (walk_fd >= 0 && slot != MPS_PROG_NONE && detail::reads_options(p)) {
                set_slot(bpf_map__fd(steps), slot, fd);
                fd = walk_fd;
            }
            set_slot(jmp, slot, fd);
        }
        // Where compiled entries hand packets they do not take (entry_emitter.cpp).
        for (Hook h : kHooks) {
            if ((h == Hook::xdp) != xdp) continue;
            for (bool preflight : {false, true}) {
                auto* prog = bpf_object__find_program_by_name(s->obj, entry_name(h, preflight));
                if (!prog || bpf_program__fd(prog) < 0) continue;
                int fd = bpf_program__fd(prog);
                set_slot(jmp, (preflight ? MPS_JMP_PREFLIGHT : MPS_JMP_ENTRY) + uint32_t(h), fd);
            }
        }
    }
}

std::vector<std::pair<std::string, std::string>> Datapath::refused_programs(const StateMaps& state,
                                                                            size_t* programs) {
    std::vector<std::pair<std::string, std::string>> refused;
    std::set<std::string> off;
    for (;;) {
        DpSkeleton obj = open_object();
        if (!obj) fail("opening the BPF object", errno);
        mps_dp* s = obj.get();
        detail::reuse_state_maps(s->obj, state);
        bpf_map__set_max_entries(s->maps.prio_tmpl, state.sizes().prio_sent());
        bpf_program* p;
        size_t n = 0;
        bpf_object__for_each_program(p, s->obj) {
            ++n;
            if (off.count(bpf_program__name(p))) bpf_program__set_autoload(p, false);
        }
        if (programs) *programs = n;
        detail::forget_refusal();
        const int err = mps_dp__load(s);
        if (err == 0) return refused;
        auto why = detail::last_refusal();
        // A failure that names no program, or one already left out, is not the verifier's.
        if (why.program.empty() || !off.insert(why.program).second)
            fail("loading the BPF programs", err);
        refused.emplace_back(why.program, why.verdict);
    }
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
        for (const char* n : kAlwaysLoaded) dp->prog_fd(n);
        for (const char* n : kPreflightEntries) dp->prog_fd(n);
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

void SkeletonDeleter::operator()(mps_dp* s) const {
    mps_dp__destroy(s);
}

Datapath::~Datapath() {
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
        if (detail::is_state_map(name) || name.find(".rodata") != std::string::npos) continue;
        if (name.find(".bss") != std::string::npos) name = "bss";
        if (int err = bpf_map__pin(m, (dir + "/" + name).c_str())) fail("pinning " + name, err);
    }
}

int Datapath::entry_fd(Hook h) const {
    return prog_fd(entry_name(h, false));
}
int Datapath::preflight_fd(Hook h) const {
    return prog_fd(entry_name(h, true));
}

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
        auto* m = bpf_object__find_map_by_name(skel_->obj,
                                               name == "bss" ? ".bss" : std::string(name).c_str());
        if (!m) throw Error("no BPF map " + std::string(name));
        return bpf_map__fd(m);
    }
    for (const auto& [n, fd] : adopted_)
        if (n == name) return fd.get();
    throw Error("no BPF map " + std::string(name));
}

void Datapath::reset() {
    if (!skel_) throw Error("resetting an adopted datapath");
    bpf_map* m;
    bpf_object__for_each_map(m, skel_->obj) {
        const int fd = bpf_map__fd(m);
        switch (bpf_map__type(m)) {
        case BPF_MAP_TYPE_HASH:
        case BPF_MAP_TYPE_LRU_HASH:
        case BPF_MAP_TYPE_PERCPU_HASH:
        case BPF_MAP_TYPE_LRU_PERCPU_HASH: {
            // Delete by the first key until none is left: deleting the key iteration stands
            // on would restart it anyway.
            std::vector<uint8_t> key(bpf_map__key_size(m));
            while (bpf_map_get_next_key(fd, nullptr, key.data()) == 0)
                if (bpf_map_delete_elem(fd, key.data()) && errno != ENOENT)
                    fail(std::string("clearing ") + bpf_map__name(m), errno);
            break;
        }
        case BPF_MAP_TYPE_PERCPU_ARRAY:
            // Per-CPU values travel padded to 8 bytes each.
            detail::zero_percpu(fd, 0, bpf_map__max_entries(m),
                                (bpf_map__value_size(m) + 7) / 8 * 8);
            break;
        default:  // arrays (the slots, the prog arrays), the ring buffer
            break;
        }
    }
    empty_slots();
    fill_prog_arrays();
}

mps_table& Datapath::table(uint32_t slot) {
    return slots_->tables[slot & 1];
}

uint32_t Datapath::live_word() const {
    return __atomic_load_n(&slots_->active, __ATOMIC_ACQUIRE);
}

uint32_t Datapath::active_slot() const {
    return live_word() & 1;
}

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

}  // namespace mpsteer::datapath
