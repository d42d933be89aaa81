function on_tick() local s = string.rep("ab", 10000); return s:match("^(.*)(.*)(.*)(.*)c$") end
