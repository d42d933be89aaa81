function on_tick() return string.format("%99999d", 1) end
