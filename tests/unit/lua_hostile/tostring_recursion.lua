-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  local t = setmetatable({}, {})
  getmetatable(t).__tostring = function(self) return tostring(self) end
  return tostring(t)
end
