// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The hooks' names (hook.h).
#include "net/hook.h"

namespace mpsteer {

std::string_view to_string(Hook h) {
    switch (h) {
    case Hook::xdp: return "xdp";
    case Hook::tc_egress: return "tc_egress";
    case Hook::tc_ingress: return "tc_ingress";
    }
    return "?";
}

std::optional<Hook> hook_from_string(std::string_view s) {
    for (Hook h : kHooks)
        if (to_string(h) == s) return h;
    return std::nullopt;
}

}  // namespace mpsteer
