function on_tick() return string.rep("x", 1 << 40) end
