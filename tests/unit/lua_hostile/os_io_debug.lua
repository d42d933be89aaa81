-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick()
  assert(io == nil and debug == nil and package == nil and require == nil and dofile == nil
         and loadfile == nil and collectgarbage == nil and string.dump == nil)
  return os.execute("id")
end
