-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() local s = "x"; for i = 1, 100 do s = s .. s end end
