-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() local t = {}; for i = 1, 1e9 do t[i] = {i} end end
