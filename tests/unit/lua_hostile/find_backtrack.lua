function on_tick() string.find(string.rep("a", 30000), ".-.-.-.-.-b") end
