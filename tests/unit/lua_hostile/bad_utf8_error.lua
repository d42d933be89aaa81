function on_tick() error("\255\254 not UTF-8 \192\128") end
