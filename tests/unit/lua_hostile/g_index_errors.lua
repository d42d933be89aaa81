-- _G's __index/__newindex raise: the host never looks globals up through them.
function on_tick() end
setmetatable(_G, {__index = function() error("no such global") end,
                  __newindex = function() error("read-only") end})
