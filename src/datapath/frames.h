// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Canned frames for pre-flight checks and benchmarks: a typical MPTCP data segment.
#pragma once

#include <cstdint>
#include <vector>

namespace mpsteer::datapath {

struct FrameSpec {
    uint32_t saddr = 0x0a000101, daddr = 0x0a000102;  // host order: 10.0.1.1 -> 10.0.1.2
    uint16_t sport = 40000, dport = 5201;
    uint16_t payload = 100;
};
// Ethernet + IPv4 + TCP with these flags and options (a multiple of 4 bytes) + payload, with
// valid IPv4 and TCP checksums.
std::vector<uint8_t> tcp_frame(const FrameSpec& spec, uint8_t flags,
                               const std::vector<uint8_t>& options);
// tcp_frame: ACK|PSH, NOP NOP TS, DSS with data ACK and DSN mapping.
std::vector<uint8_t> mptcp_data_frame(const FrameSpec& spec = {});

}  // namespace mpsteer::datapath
