-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() local s = string.rep("a", 20000); s:gsub("a-a-a-a-b", "") end
