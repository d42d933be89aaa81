-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Small-flow path manager (eMPTCP): a connection stays on one path until it has carried
-- `threshold_bytes`; then the ADD_ADDR the datapath hid (blk_subflow) is re-injected
-- (add_subflow) so the host opens its other subflows. Short flows finish on one path and do
-- not pay for subflow setup; long flows still get every path. API: lua/README.md.
--
-- With `add_subflow: {after_bytes: ...}` (policies/small-flow-pm.yaml) the datapath re-injects
-- on the packet that crosses the threshold; this hook then finds the announcement released
-- (mpsteer.add_subflow returns false) and only logs. It re-injects itself what the datapath
-- does not track (address ids from 32 up), and everything under an add_subflow without
-- after_bytes, one tick (`every`) late at most.

local threshold = params.threshold_bytes or 220000
local blocked = {}  -- token -> list of hidden announcements (address ids)

function on_add_addr_blocked(a)
  local list = blocked[a.token] or {}
  list[#list + 1] = a.addr_id
  blocked[a.token] = list
  mpsteer.log("debug", string.format("hid %s (id %d) from connection %08x",
                                     a.address, a.addr_id, a.token))
end

function on_tick()
  for token, ids in pairs(blocked) do
    local conn = mpsteer.connection(token)
    if not conn then
      blocked[token] = nil  -- closed before it grew (or its keys were never seen)
    elseif conn.bytes >= threshold then
      local by_hook = 0
      for _, id in ipairs(ids) do
        if mpsteer.add_subflow(token, id) then by_hook = by_hook + 1 end
      end
      mpsteer.log("info", string.format("connection %08x passed %d bytes: its other " ..
                                        "subflows open (%d of %d announcements re-injected " ..
                                        "by this hook)", token, threshold, by_hook, #ids))
      blocked[token] = nil
    end
  end
end
