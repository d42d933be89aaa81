function on_tick() local s = string.rep("a", 20000); s:gsub("a-a-a-a-b", "") end
