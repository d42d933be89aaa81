-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- ECF (Earliest Completion First, Lim et al., CoNEXT'17) as the slow path's backup flag.
-- Every `every` (on_tick), for each connection: f = the fastest subflow (lowest srtt), s = the
-- next one. ECF sends on f while f has room in its window, and s is not used then (here: more
-- than a quarter of f's cwnd free on `hold_ticks` ticks in a row, TCP_INFO being sampled, not
-- seen per packet; and only when srtt_s >= min_rtt_ratio * srtt_f: alike paths gain nothing). Once f's window is full, with k unsent bytes and
-- delta = max(rttvar_f, rttvar_s):
--   if (1 + k/cwnd_f) * rtt_f < (1 + waiting*beta) * (rtt_s + delta) then
--     if (k/cwnd_s) * rtt_s >= 2*rtt_f + delta then wait for f (waiting = 1)
--     else use s
--   else waiting = 0 and use s.
-- "Wait" (s not used) sets B=1 on the policy's set_backup actions: the ACKs this host receives
-- on the slow path carry MP_PRIO, and the kernel's scheduler gives that subflow no new data
-- while f is active; "use s" sets B=0. A held subflow gets no RTT samples: once its stale srtt
-- makes it look the fastest, or it is idle while the other carries the data, it is released. The flag is the policy's, one
-- for all connections: the slow path is used while any connection uses it. Subflows without
-- an RTT sample or cwnd (not this host's sockets) are left out. API: lua/README.md.

local beta = params.beta or 0.25
local hold_ticks = params.hold_ticks or 3
local min_rtt_ratio = params.min_rtt_ratio or 1.5
local resignal_ticks = params.resignal_ticks or 10
local since_write = 0
local dirty = false  -- B changed while connections with two subflows were up
local waiting = {}   -- token -> the ECF "waiting" flag
local room = {}      -- token -> ticks in a row f had room
local held = {}      -- token -> the subflow held back
local backup = false -- B last written (the manifest's value at load)

local function fastest_two(subflows)
  local f, s
  for _, sf in ipairs(subflows) do
    if sf.srtt_us > 0 and sf.cwnd > 0 and not sf.backup then
      if not f or sf.srtt_us < f.srtt_us then
        f, s = sf, f
      elseif not s or sf.srtt_us < s.srtt_us then
        s = sf
      end
    end
  end
  return f, s
end

-- ECF's rule once f's window is full: true to wait for f.
local function ecf_wait(conn, f, s)
  local k = conn.unsent
  local rtt_f, rtt_s = f.srtt_us, s.srtt_us
  local delta = math.max(f.rttvar_us, s.rttvar_us)
  local w = false
  if (1 + k / f.cwnd) * rtt_f < (1 + (waiting[conn.token] and beta or 0)) * (rtt_s + delta) then
    w = (k / s.cwnd) * rtt_s >= 2 * rtt_f + delta
  end
  waiting[conn.token] = w
  return w
end

-- True when s should not be used now.
local function hold(conn, f, s)
  local t = conn.token
  -- The held subflow gets no RTT samples: when its stale srtt makes it look the fastest, or
  -- it is idle while the other carries the data, release it and measure again.
  if held[t] == f.id or (f.inflight == 0 and s.inflight > 0) then
    held[t], room[t] = nil, 0
    return false
  end
  if f.inflight == 0 then return held[t] ~= nil end  -- nothing sent: the decision stands
  if f.cwnd - f.inflight > f.cwnd / 4 then
    -- Alike paths: waiting for f gains nothing (ECF's rule below says the same when full).
    if s.srtt_us < min_rtt_ratio * f.srtt_us then
      held[t], room[t] = nil, 0
      return false
    end
    room[t] = (room[t] or 0) + 1
    if not held[t] and room[t] < hold_ticks then return false end
  else
    room[t] = 0
    if not ecf_wait(conn, f, s) then
      held[t] = nil
      return false
    end
  end
  held[t] = s.id
  return true
end

function on_tick()
  local use, any, live = false, false, {}
  for _, conn in ipairs(mpsteer.connections()) do
    live[conn.token] = true
    local f, s = fastest_two(conn.subflows)
    if f and s then
      any = true
      if not hold(conn, f, s) then use = true end
    end
  end
  for token in pairs(room) do
    if not live[token] then waiting[token], room[token], held[token] = nil, nil, nil end
  end
  local wait = any and not use
  since_write = since_write + 1
  dirty = dirty and any
  -- Written again every resignal_ticks after a change: the agent sends the MP_PRIO of a quiet
  -- subflow (no ACK to carry it) only when the flag is written, and a subflow may go quiet
  -- just after. A host that never holds a path back never writes.
  if wait ~= backup or (dirty and since_write >= resignal_ticks) then
    mpsteer.set_policy_backup(wait)
    backup, since_write, dirty = wait, 0, any
  end
end

function on_apply()
  backup = false  -- a new revision starts from the manifest's B
end
