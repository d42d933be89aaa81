-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- _G's __index/__newindex raise: the host never looks globals up through them.
function on_tick() end
setmetatable(_G, {__index = function() error("no such global") end,
                  __newindex = function() error("read-only") end})
