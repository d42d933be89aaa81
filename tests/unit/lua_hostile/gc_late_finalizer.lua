-- A __gc placeholder now, a function later: refused at setmetatable.
local mt = {__gc = true}
local t = setmetatable({}, mt)
mt.__gc = function() while true do end end
t = nil
function on_tick() end
