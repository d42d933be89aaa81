function on_tick() local t = {}; for i = 1, 1e9 do t[i] = {i} end end
