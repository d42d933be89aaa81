-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  local co = coroutine.wrap(function() while true do end end)
  co()
end
