function on_tick() error(string.rep("\195\169", 300000)) end
