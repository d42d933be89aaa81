-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() return string.rep("x", 1 << 40) end
