function on_tick() ("aaaa"):gsub("a", function() while true do end end) end
