// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "net/text.h"

#include <cstdint>
#include <cstdio>

namespace mpsteer::net {
namespace {
// Length of the valid UTF-8 sequence at s[i], 0 when there is none.
size_t utf8_length(std::string_view s, size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xE  ? 3
                       : (c >> 3) == 0x1E ? 4
                                          : 0;
    if (len == 0 || i + len > s.size()) return 0;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (size_t j = 1; j < len; ++j) {
        const auto b = static_cast<unsigned char>(s[i + j]);
        if ((b >> 6) != 0x2) return 0;
        cp = (cp << 6) | (b & 0x3F);
    }
    // Overlong forms, surrogates and beyond U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}
}  // namespace

std::string escape_control(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    char buf[8];
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        const size_t len = utf8_length(s, i);
        if (len == 1 && c >= 0x20 && c != 0x7F) {
            out += static_cast<char>(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (len == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(s[i + 1]));
            out += buf;
        } else if (len > 1) {
            out.append(s.substr(i, len));
        } else {  // another C0 control, DEL, or a byte that is not UTF-8
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
            i += 1;
            continue;
        }
        i += len;
    }
    return out;
}

}  // namespace mpsteer::net
