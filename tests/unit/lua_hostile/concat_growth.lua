function on_tick() local s = "x"; for i = 1, 100 do s = s .. s end end
