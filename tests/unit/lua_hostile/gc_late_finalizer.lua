-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- A __gc placeholder now, a function later: refused at setmetatable.
local mt = {__gc = true}
local t = setmetatable({}, mt)
mt.__gc = function() while true do end end
t = nil
function on_tick() end
