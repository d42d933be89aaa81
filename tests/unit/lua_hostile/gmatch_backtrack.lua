-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  for a in string.gmatch(string.rep("a", 5000), "(.-)(.-)(.-)x") do end
end
