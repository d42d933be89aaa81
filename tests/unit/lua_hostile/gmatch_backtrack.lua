function on_tick()
  for a in string.gmatch(string.rep("a", 5000), "(.-)(.-)(.-)x") do end
end
