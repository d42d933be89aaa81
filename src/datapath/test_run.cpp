// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// BPF_PROG_TEST_RUN of one frame through a program: the pre-flight, the control program
// (StateMaps::update_flow), the bench and the tests all run frames through this.
#include "datapath/internal.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <cerrno>

namespace mpsteer::datapath {

using detail::fail;

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
    if (xdp && xdp_out.data > 0 && xdp_out.data <= r.out.size()) {
        r.meta_len = xdp_out.data;
        r.out.erase(r.out.begin(), r.out.begin() + xdp_out.data);
    }
    return r;
}

}  // namespace mpsteer::datapath
