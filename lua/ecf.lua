-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
-- ECF (Earliest Completion First, Lim et al., CoNEXT'17) as per-subflow rates.
-- Every `every` (on_tick), for each connection: f = the fastest subflow (lowest srtt), s = the
-- next one. f is never capped. While f's window is full, with k unsent bytes,
-- delta = max(rttvar_f, rttvar_s):
--   if (1 + k/cwnd_f) * rtt_f < (1 + waiting*beta) * (rtt_s + delta) then
--     if (k/cwnd_s) * rtt_s >= 2*rtt_f + delta then wait for f (waiting = 1): s is held back
--     else use s
--   else waiting = 0 and use s.
-- "Held back" is rate 1 B/s, i.e. rate_limit's min_window; "use" is max_rate. The datapath's
-- rate_limit actor enforces the rates on the ACKs this host receives. Subflows without an
-- RTT sample or cwnd (not this host's sockets) are left alone. API: lua/README.md.

local beta = params.beta or 0.25
local max_rate = params.max_rate or 125000000  -- bytes/s, or a rate string ("1Gbit")
if type(max_rate) == "string" then max_rate = mpsteer.rate(max_rate) end
local waiting = {}  -- token -> the ECF "waiting" flag
local last = {}     -- subflow id -> rate written (write only on change)

local function set(id, rate)
  if last[id] ~= rate then
    if mpsteer.set_rate(id, rate) then last[id] = rate end
  end
end

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

-- True when s should wait for f.
local function hold_slow(conn, f, s)
  if f.cwnd > f.inflight then return false end  -- f has room: nothing to decide
  local k = conn.unsent
  local rtt_f, rtt_s = f.srtt_us, s.srtt_us
  local delta = math.max(f.rttvar_us, s.rttvar_us)
  local w = waiting[conn.token] and 1 or 0
  if (1 + k / f.cwnd) * rtt_f < (1 + w * beta) * (rtt_s + delta) then
    if (k / s.cwnd) * rtt_s >= 2 * rtt_f + delta then
      waiting[conn.token] = true
      return true
    end
    return false
  end
  waiting[conn.token] = false
  return false
end

function on_tick()
  for _, conn in ipairs(mpsteer.connections()) do
    local f, s = fastest_two(conn.subflows)
    if f then
      set(f.id, 0)  -- the fastest subflow is never capped
      if s then
        local rate = hold_slow(conn, f, s) and 1 or max_rate
        for _, sf in ipairs(conn.subflows) do
          if sf.id ~= f.id and sf.srtt_us > 0 and not sf.backup then set(sf.id, rate) end
        end
      end
    end
  end
end

function on_subflow_closed(sf)
  last[sf.id] = nil
end
