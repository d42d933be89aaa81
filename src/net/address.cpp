// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "net/address.h"

#include <arpa/inet.h>

namespace mpsteer::net {

std::string address_text(uint8_t family, const void* bytes) {
    char buf[INET6_ADDRSTRLEN] = {};
    inet_ntop(family == 6 ? AF_INET6 : AF_INET, bytes, buf, sizeof buf);
    return buf;
}

std::string endpoint_text(uint8_t family, const void* bytes, uint16_t port) {
    std::string a = address_text(family, bytes);
    return (family == 6 ? "[" + a + "]" : a) + ":" + std::to_string(port);
}

}  // namespace mpsteer::net
