// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "datapath/frames.h"

#include "datapath/inet_csum.h"

#include <arpa/inet.h>

#include <cstring>

namespace mpsteer::datapath {

namespace {
void put16(uint8_t* p, uint16_t v) {
    p[0] = v >> 8, p[1] = v & 0xff;
}
void put32(uint8_t* p, uint32_t v) {
    put16(p, v >> 16), put16(p + 2, v & 0xffff);
}
}  // namespace

std::vector<uint8_t> tcp_frame(const FrameSpec& s, uint8_t flags,
                               const std::vector<uint8_t>& opts) {
    const size_t eth = 14, ip = 20, tcp = 20 + opts.size();
    std::vector<uint8_t> f(eth + ip + tcp + s.payload, 0);
    uint8_t* e = f.data();
    std::memcpy(e, "\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00", 14);
    uint8_t* i = e + eth;
    i[0] = 0x45;
    put16(i + 2, static_cast<uint16_t>(ip + tcp + s.payload));
    i[6] = 0x40;  // DF
    i[8] = 64;
    i[9] = 6;
    put32(i + 12, s.saddr);
    put32(i + 16, s.daddr);
    put16(i + 10, csum_fold(csum_add(i, ip)));
    uint8_t* t = i + ip;
    put16(t, s.sport);
    put16(t + 2, s.dport);
    put32(t + 4, 1000);
    put32(t + 8, 2000);
    t[12] = static_cast<uint8_t>((tcp / 4) << 4);
    t[13] = flags;
    put16(t + 14, 512);
    std::memcpy(t + 20, opts.data(), opts.size());
    for (size_t k = 0; k < s.payload; ++k) t[tcp + k] = static_cast<uint8_t>(k);
    uint32_t pseudo = csum_add(i + 12, 8) + 6 + static_cast<uint32_t>(tcp + s.payload);
    put16(t + 16, csum_fold(csum_add(t, tcp + s.payload, pseudo)));
    return f;
}

std::vector<uint8_t> mptcp_data_frame(const FrameSpec& s) {
    // TCP options: NOP NOP TS(10) + DSS(20: flags A|M, data ACK 4, DSN 4, SSN 4, len 2, pad)
    return tcp_frame(s, 0x18 /* ACK|PSH */,
                     {1, 1, 8,    10, 0, 0, 0,    1, 0, 0, 0, 2, 30, 20,  0x20, 0x05,
                      0, 0, 0x10, 0,  0, 0, 0x20, 0, 0, 0, 0, 1, 0,  100, 1,    1});
}

}  // namespace mpsteer::datapath
