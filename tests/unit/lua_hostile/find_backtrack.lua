-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() string.find(string.rep("a", 30000), ".-.-.-.-.-b") end
