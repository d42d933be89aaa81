function on_tick() while true do mpsteer.log("info", "\255 spam") end end
