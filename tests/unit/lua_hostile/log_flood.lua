-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() while true do mpsteer.log("info", "\255 spam") end end
