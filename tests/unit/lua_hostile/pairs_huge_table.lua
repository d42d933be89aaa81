local t = {}
for i = 1, 50000 do t["k" .. i] = i end
function on_tick() while true do for k, v in pairs(t) do end end end
