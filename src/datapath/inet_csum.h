// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The Internet checksum (RFC 1071) for the frames userspace builds (frames.cpp, the
// set_backup frames of actors.cpp). The test suite's packet builder (tests/bpf/packet.cpp)
// keeps its own on purpose: an oracle written apart from the code it checks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpsteer::datapath {

// Adds bytes, as big-endian 16-bit words (an odd last byte padded with zero), to a running
// one's-complement sum; start from a pseudo-header's sum where there is one.
inline uint32_t csum_add(const uint8_t* p, size_t n, uint32_t acc = 0) {
    for (size_t i = 0; i + 1 < n; i += 2) acc += uint32_t(p[i]) << 8 | p[i + 1];
    if (n & 1) acc += uint32_t(p[n - 1]) << 8;
    return acc;
}

// The checksum field's value (host order) for a sum: folded to 16 bits and complemented.
inline uint16_t csum_fold(uint32_t acc) {
    while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
    return static_cast<uint16_t>(~acc);
}

}  // namespace mpsteer::datapath
