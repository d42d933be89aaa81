-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
local function f(n) return 1 + f(n + 1) end
function on_tick() return f(1) end
