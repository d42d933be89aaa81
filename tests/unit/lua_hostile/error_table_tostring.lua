function on_tick()
  error(setmetatable({}, {__tostring = function() error("tostring raised") end}))
end
