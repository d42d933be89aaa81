-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- Paths that fail and come back (policies/path-resilience.yaml). A path is one of the host's
-- `subflow` endpoints (`ip mptcp endpoint`). When a path fails the kernel moves the data to the
-- other subflows on its own (its stale-subflow rule), but when the path returns it makes no new
-- subflow: the old one resumes only when its backed-off retransmission timer fires, seconds
-- later, and a subflow that died with its path is never made again. Here:
--   * a link going down marks the paths of its endpoints down; coming up, they are renewed at
--     once (the kernel closes the subflows bound to the address and sends a new MP_JOIN);
--   * a subflow that has carried data and has heard nothing from its peer for stall_ms, while
--     another subflow of its connection has, marks its path stalled (a blackhole: the links
--     stay up);
--   * a path coming back or stalled is renewed every probe_every_ms, one SYN each time, until
--     a subflow over it hears from its peer again.
-- The status shows each path that is not working ("down" / "probing") and the renewals made.
local stall_s = (params.stall_ms or 1000) / 1000
local probe_s = (params.probe_every_ms or 1000) / 1000

-- By address: {state = "down" | "probing", probed = time of the last renewal}. A path that
-- works has no entry.
local paths = {}
local renewals = 0

local function publish()
  local s = {renewals = renewals}
  for address, p in pairs(paths) do s[address] = p.state end
  mpsteer.set_status(s)
end

local function set_state(address, state, why)
  local p = paths[address]
  if p and p.state == state then return p end
  mpsteer.log("info", string.format("path %s %s (%s)", address, state, why))
  p = {state = state, probed = -math.huge}
  paths[address] = p
  publish()
  return p
end

local function probe(address, p, now)
  if now - p.probed < probe_s then return end
  p.probed = now
  if mpsteer.renew_endpoint(address) then
    renewals = renewals + 1
    publish()
  end
end

function on_link(l)
  for _, e in ipairs(mpsteer.endpoints()) do
    if e.subflow and e.interface == l.interface then
      if not l.up then
        set_state(e.address, "down", l.interface .. " down")
      elseif paths[e.address] then
        probe(e.address, set_state(e.address, "probing", l.interface .. " up"), mpsteer.time())
      end
    end
  end
end

-- Time since the subflow last heard from its peer (data or an acknowledgment), in seconds.
local function quiet(s)
  return math.min(s.last_recv_ms, s.last_ack_ms) / 1000
end

function on_tick()
  local now = mpsteer.time()
  local ours = {}
  for _, e in ipairs(mpsteer.endpoints()) do
    if e.subflow then ours[e.address] = true end
  end
  local alive, stalled = {}, {}
  for _, c in ipairs(mpsteer.connections()) do
    local heard = false  -- some subflow of the connection heard from the peer lately
    for _, s in ipairs(c.subflows) do
      if s.local_socket and quiet(s) < stall_s / 2 then heard = true end
    end
    for _, s in ipairs(c.subflows) do
      local a = s.local_address
      if s.local_socket and ours[a] then
        if quiet(s) < stall_s then
          alive[a] = true
        elseif (s.bytes_received > 0 and heard) or s.inflight > 0 then
          stalled[a] = true
        end
      end
    end
  end
  for a in pairs(stalled) do
    if not alive[a] and not paths[a] then
      set_state(a, "probing", string.format("no data for %.1f s", stall_s))
    end
  end
  for a, p in pairs(paths) do
    if alive[a] and p.state == "probing" then  -- a path that is down waits for its link
      mpsteer.log("info", string.format("path %s back", a))
      paths[a] = nil
      publish()
    elseif p.state == "probing" then
      probe(a, p, now)
    end
  end
end
