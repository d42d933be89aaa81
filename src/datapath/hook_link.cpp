// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Attachments (HookLink): a program on one interface and hook, through an XDP link (native,
// generic as fallback), a TCX link, or a clsact filter on kernels without TCX; swapping the
// program atomically, pinning, adopting and detaching.
#include "datapath/internal.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace mpsteer::datapath {

using detail::fail;

namespace {
// Not in Debian 12's UAPI headers (Linux 6.1); values from Linux 6.6's enum bpf_attach_type.
constexpr int kAttachTcxIngress = 46;
constexpr int kAttachTcxEgress = 47;
// Handle and priority of our clsact filter on kernels without TCX.
constexpr uint32_t kTcHandle = 0x6d70;  // "mp"
constexpr uint32_t kTcPriority = 1;

uint32_t prog_id_of(int prog_fd) {
    bpf_prog_info info{};
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(prog_fd, &info, &len)) fail("reading a program's id", errno);
    return info.id;
}
}  // namespace

std::unique_ptr<HookLink> HookLink::attach(const std::string& ifname, Hook hook, int prog_fd) {
    std::unique_ptr<HookLink> l(new HookLink());
    l->ifname_ = ifname;
    l->hook_ = hook;
    l->ifindex_ = static_cast<int>(detail::ifindex_of(ifname));
    l->prog_id_ = prog_id_of(prog_fd);
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
    // MPSTEER_TC_WITHOUT_TCX=1 takes the path of kernels before 6.6 on a newer one (tests).
    const char* no_tcx = std::getenv("MPSTEER_TC_WITHOUT_TCX");
    if (!no_tcx || std::string(no_tcx) != "1") {
        int fd = bpf_link_create(
            prog_fd, l->ifindex_,
            static_cast<bpf_attach_type>(egress ? kAttachTcxEgress : kAttachTcxIngress), nullptr);
        if (fd >= 0) {
            l->link_ = Fd(fd);
            l->mode_ = "tcx";
            return l;
        }
        spdlog::debug("{}: TCX unavailable ({}), using a clsact filter", ifname,
                      std::strerror(errno));
    }
    LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = l->ifindex_,
                .attach_point = egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
    if (int err = bpf_tc_hook_create(&th); err && err != -EEXIST)
        fail("creating clsact on " + ifname, err);
    // Replacing: the filter an earlier agent left running at our handle (an agent leaves its
    // datapath attached when it exits, and a filter has no link to pin and adopt) is taken
    // over, with no moment without a program.
    LIBBPF_OPTS(bpf_tc_opts, to, .prog_fd = prog_fd, .flags = BPF_TC_F_REPLACE, .handle = kTcHandle,
                .priority = kTcPriority);
    if (int err = bpf_tc_attach(&th, &to)) fail("attaching TC to " + ifname, err);
    l->mode_ = "tc-filter";
    return l;
}

std::unique_ptr<HookLink> HookLink::adopt(const std::string& pin_path, const std::string& ifname,
                                          Hook hook) {
    std::unique_ptr<HookLink> l(new HookLink());
    l->ifname_ = ifname;
    l->hook_ = hook;
    l->pin_path_ = pin_path;
    int fd = bpf_obj_get(pin_path.c_str());
    if (fd < 0) fail("adopting link " + pin_path, errno);
    l->link_ = Fd(fd);
    bpf_link_info info{};
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len)) fail("reading link " + pin_path, errno);
    l->prog_id_ = info.prog_id;
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
        Fd current;
        if (expect_current) {
            current = program();
            opts.flags = BPF_F_REPLACE;
            opts.old_prog_fd = static_cast<__u32>(current.get());
        }
        if (bpf_link_update(link_.get(), new_prog_fd, &opts))
            fail("swapping the program on " + ifname_ + " " + std::string(to_string(hook_)), errno);
    } else {
        LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = ifindex_,
                    .attach_point = hook_ == Hook::tc_egress ? BPF_TC_EGRESS : BPF_TC_INGRESS);
        LIBBPF_OPTS(bpf_tc_opts, to, .prog_fd = new_prog_fd, .flags = BPF_TC_F_REPLACE,
                    .handle = kTcHandle, .priority = kTcPriority);
        if (int err = bpf_tc_attach(&th, &to)) fail("replacing the TC program on " + ifname_, err);
    }
    prog_id_ = prog_id_of(new_prog_fd);
}

bool HookLink::runs(int prog_fd) const {
    return prog_id_of(prog_fd) == prog_id_;
}

Fd HookLink::program() const {
    Fd fd(bpf_prog_get_fd_by_id(prog_id_));
    if (!fd)
        fail("the program on " + ifname_ + " " + std::string(to_string(hook_)) + " is gone", errno);
    return fd;
}

std::vector<uint32_t> attached_programs(const std::string& ifname, Hook hook) {
    const int ifindex = static_cast<int>(detail::ifindex_of(ifname));
    if (hook == Hook::xdp) {
        uint32_t id = 0;
        if (bpf_xdp_query_id(ifindex, 0, &id) || !id) return {};
        return {id};
    }
    uint32_t ids[64], count = 64;
    const int type = hook == Hook::tc_egress ? kAttachTcxEgress : kAttachTcxIngress;
    if (bpf_prog_query(ifindex, static_cast<bpf_attach_type>(type), 0, nullptr, ids, &count))
        return {};
    return {ids, ids + count};
}

void HookLink::pin(const std::string& path) {
    if (!link_) return;  // clsact filters stay until removed
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    unlink(path.c_str());  // a stale pin of a link that is gone
    if (bpf_obj_pin(link_.get(), path.c_str())) fail("pinning link " + path, errno);
    pin_path_ = path;
}

std::vector<std::string> detach_pinned_links(const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        if (Fd fd(bpf_obj_get(entry.path().c_str())); fd) bpf_link_detach(fd.get());
        names.push_back(entry.path().filename().string());
    }
    return names;
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

}  // namespace mpsteer::datapath
