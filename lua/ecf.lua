-- ECF (Earliest Completion First, Lim et al., CoNEXT'17) as per-subflow rates.
-- Called every `every` (on_tick) with the connections the policy selected. For each
-- connection: the fastest subflow f (lowest srtt) is never capped; a slower subflow s is held
-- back (rate 0 -> the minimum window) while waiting for f completes the unsent data sooner,
-- and released (max_rate) otherwise. The datapath's rate_limit actor enforces the rates.
--
-- Engine API (issue 6): mpsteer.connections() -> list of connections, each with
-- .token, .unsent (bytes), .subflows = { {id, srtt_us, rttvar_us, cwnd (bytes), inflight,
-- rate, backup}, ... }; mpsteer.set_rate(subflow_id, bytes_per_second or 0 = uncapped);
-- mpsteer.log(level, message); params from the manifest in `params`.

local beta = params.beta or 0.25
local max_rate = params.max_rate_bytes or 125000000  -- 1 Gbit/s in bytes/s
local waiting = {}  -- per connection token: the ECF "waiting" flag

local function fastest_two(subflows)
  local f, s
  for _, sf in ipairs(subflows) do
    if sf.srtt_us > 0 and not sf.backup then
      if not f or sf.srtt_us < f.srtt_us then
        f, s = sf, f
      elseif not s or sf.srtt_us < s.srtt_us then
        s = sf
      end
    end
  end
  return f, s
end

-- The ECF rule: true when the slower subflow should wait for the fastest one.
local function should_wait(conn, f, s)
  local k = conn.unsent
  if f.cwnd - f.inflight > 0 then return true end  -- f has window space: use f
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
      mpsteer.set_rate(f.id, 0)  -- the fastest subflow is never capped
      if s then
        local hold = should_wait(conn, f, s)
        for _, sf in ipairs(conn.subflows) do
          if sf.id ~= f.id then mpsteer.set_rate(sf.id, hold and 1 or max_rate) end
        end
      end
    end
  end
end

function on_subflow_closed(sf)
  mpsteer.set_rate(sf.id, 0)
end
