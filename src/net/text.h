// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Text that came from a policy repository on its way into a log line or the status: one line,
// nothing a terminal would act on.
#pragma once

#include <string>
#include <string_view>

namespace mpsteer::net {

// Escapes C0 controls (\n, \r, \t as such, the others as \xNN), DEL, C1 controls written as
// UTF-8 (\u0080..\u009f) and bytes that are not UTF-8 (\xNN). Printable UTF-8 stays as is.
std::string escape_control(std::string_view s);

}  // namespace mpsteer::net
