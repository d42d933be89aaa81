-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  setmetatable(mpsteer, {__index = function() while true do end end})
  return mpsteer.no_such_function
end
