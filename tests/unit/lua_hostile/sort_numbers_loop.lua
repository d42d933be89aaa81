-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Sorts a table of 2^19 numbers in a loop, each table.sort one library call (8 MB: within the
-- default memory cap).
t = {}
local n = 1 << 19
for i = 1, n do t[i] = (i * 7919) % n end
function on_tick()
    while true do
        table.sort(t)
        table.sort(t, function(a, b) return a > b end)
    end
end
