function on_tick()
  local t = setmetatable({}, {})
  getmetatable(t).__tostring = function(self) return tostring(self) end
  return tostring(t)
end
