function on_tick()
  getmetatable("").__index = function() while true do end end
  return ("x"):anything()
end
