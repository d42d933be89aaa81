-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Finalizers run with hooks off: refused.
local t = setmetatable({}, {__gc = function() while true do end end})
function on_tick() end
