-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() local s = string.rep("ab", 10000); return s:match("^(.*)(.*)(.*)(.*)c$") end
