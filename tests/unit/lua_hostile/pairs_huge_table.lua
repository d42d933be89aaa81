-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
local t = {}
for i = 1, 50000 do t["k" .. i] = i end
function on_tick() while true do for k, v in pairs(t) do end end end
