-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  error(setmetatable({}, {__tostring = function() error("tostring raised") end}))
end
