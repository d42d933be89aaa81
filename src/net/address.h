// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Addresses as text, in one place. Families are the project's own encoding (4 or 6), as in
// manifest::IpAddr and the datapath's mps_flow_key; any other value is read as IPv4.
#pragma once

#include <cstdint>
#include <string>

namespace mpsteer::net {

// "10.0.1.1", "fd00:1::1"; `bytes` holds 4 or 16 bytes in network order.
std::string address_text(uint8_t family, const void* bytes);

// "10.0.1.1:80", "[fd00:1::1]:80".
std::string endpoint_text(uint8_t family, const void* bytes, uint16_t port);

}  // namespace mpsteer::net
