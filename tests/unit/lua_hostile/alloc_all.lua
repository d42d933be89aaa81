-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Allocates all it can, keeping it, and swallows the refusals to try again.
hoard = {}
function on_tick()
    while true do
        pcall(function()
            while true do hoard[#hoard + 1] = string.rep("x", 1 << 16) .. #hoard end
        end)
    end
end
