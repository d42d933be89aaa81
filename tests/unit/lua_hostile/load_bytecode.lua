-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  local f, err = load("\27LuaT\0\25\147\13\10\26\10\4\8\8xV\0\0\0\0\0\0\0\0\0\0\0(w@")
  assert(not f)
  local ok, e2 = pcall(load, "return 1", "x", "b")
  assert(not ok)
  error("refused: " .. err)
end
