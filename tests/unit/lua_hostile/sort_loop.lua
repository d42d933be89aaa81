-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Builds a table of 2^19 strings a small slice per tick (each tick well within its budget, also
-- under emulation), then sorts it in a loop: one table.sort is a single library call that no
-- instruction count interrupts.
t = {}
local n = 1 << 19
function on_tick()
    if #t < n then
        for i = #t + 1, math.min(#t + 4096, n) do t[i] = string.format("%09d", (i * 7919) % n) end
        return
    end
    while true do
        table.sort(t, nil)
        table.sort(t, function(a, b) return a > b end)
    end
end
