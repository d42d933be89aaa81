-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Writes the policy's backup flag in a tight loop on every tick, swallowing every refusal and
-- staying within its call budget (so only the write budget can stop it).
local flip = false
function on_tick()
    for _ = 1, 200 do
        flip = not flip
        pcall(mpsteer.set_policy_backup, flip)
    end
end
