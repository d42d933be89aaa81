function on_tick() while true do mpsteer.connections() end end
