// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The hooks a chain runs at, in one place: what a manifest attaches to and where the datapath
// enters (the values are abi.h's enum mps_hook: src/datapath/chain.h checks them).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace mpsteer {

enum class Hook : uint8_t { xdp = 0, tc_egress = 1, tc_ingress = 2 };
inline constexpr Hook kHooks[] = {Hook::xdp, Hook::tc_egress, Hook::tc_ingress};

std::string_view to_string(Hook h);                        // "xdp", "tc_egress", "tc_ingress"
std::optional<Hook> hook_from_string(std::string_view s);  // the same names

}  // namespace mpsteer
