-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() ("aaaa"):gsub("a", function() while true do end end) end
