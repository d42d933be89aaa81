-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  for i = 1, 100 do pcall(function() while true do end end) end
  while true do end
end
