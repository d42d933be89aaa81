-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() return string.format("%99999d", 1) end
