function on_tick() error(string.rep("\195\169", 1000000)) end
