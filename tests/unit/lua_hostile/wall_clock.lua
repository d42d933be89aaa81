function on_tick() while true do end end
