function on_tick()
  local co = coroutine.wrap(function() while true do end end)
  co()
end
