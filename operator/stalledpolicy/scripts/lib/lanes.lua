-- lanes: one call's lane bookkeeping (docs/scripts.md, "The ring/wake rule")
-- with one command per kind of check for all the lanes the call touched, not
-- one per lane: at small batches the per-lane commands used to cost as much
-- as the per-job ones. Uses chunked and counters (include them before lanes).
--
--   settle_lanes(k, groups, freed, gained)
--
-- k       {prefix=, ring=, paused=, glimit=, gactive=, wake=} (keys of the queue),
--         and unsettled=: a table the lanes left off the ring for a corrupt
--         field are added to (key, group, value, key, group, value, ...): a
--         gactive that is not a count, a glimit that is not a number
-- groups  the lanes touched by the call, each once, in the order first seen
-- freed   group -> slots the call gives back in gactive (nil or 0: none)
-- gained  group -> true when the call has just added jobs to the lane
--
-- gactive[g] -= freed[g] (HINCRBY), the field deleted at 0 or below. A gactive that is
-- not an integer is EchoMQ's corruption, not ours to rewrite: it is left as it
-- is and the lane is not ringed (EchoMQ's claim of a lane job increments it,
-- and fails half-way on it: the job popped and active with no worker), and
-- the lane goes into k.unsettled for the caller to report. Then each lane goes
-- back on ring, with one wake, when it has work, is not paused, is under its
-- glimit (none: no limit) and is not on ring yet. A glimit that is not a
-- number (by tonumber, EchoMQ's own test) is no limit to us, but EchoMQ's
-- claim compares with it and fails half-way (the job popped, active with no
-- worker, stalled again and again to the morgue, never run): such a lane stays
-- off the ring, in k.unsettled.

-- gactive as HINCRBY reads it (an optional minus, no leading zero), within
-- the 15 digits a Lua double holds exactly; a missing field is 0.
local function in_flight(value)
  if value == false or value == '0' then return 0 end
  if not string.find(value, '^%-?[1-9]%d*$') then return nil end
  if #value > 15 and (#value > 16 or string.byte(value) ~= 45) then return nil end  -- 45: '-'
  return tonumber(value)
end

-- a ring at most this many times longer than the lanes to look up is read
-- whole (one LRANGE) rather than searched once per lane (one LPOS each)
local RING_READ_FACTOR = 4

local function on_ring(ring_key, lanes)
  local found = {}
  if #lanes > 1 and redis.call('LLEN', ring_key) <= RING_READ_FACTOR * #lanes then
    for _, g in ipairs(redis.call('LRANGE', ring_key, '0', '-1')) do found[g] = true end
  else
    for _, g in ipairs(lanes) do
      if redis.call('LPOS', ring_key, g) then found[g] = true end
    end
  end
  return found
end

local function has_work(zcard_reply)
  return type(zcard_reply) == 'number' and zcard_reply > 0
end

local function unsettle(k, key, g, value)
  local unsettled = k.unsettled
  unsettled[#unsettled + 1] = key
  unsettled[#unsettled + 1] = g
  unsettled[#unsettled + 1] = value
end

-- gactive[g] -= give_back by HINCRBY (docs/architecture.md, "Numbers counted
-- by Redis"): the count after,
-- or nil when the field is not a count (then left as it was, and unsettled).
-- HINCRBY refuses what in_flight refuses but more than 15 digits: those are
-- put back. Any other error (a key of the wrong type, a refusal) is raised by
-- the HGET that reads the field for the report.
local function give_back_slots(k, g, give_back)
  local n = redis.pcall('HINCRBY', k.gactive, g, '-' .. count_string(give_back))
  if type(n) == 'number' and n + give_back > -COUNTER_LIMIT and n + give_back < COUNTER_LIMIT then return n end
  if type(n) == 'number' then redis.call('HINCRBY', k.gactive, g, count_string(give_back)) end
  local value = redis.call('HGET', k.gactive, g)
  if value and in_flight(value) == nil then
    unsettle(k, k.gactive, g, value)
    return nil
  end
  error(n)
end

local function settle_lanes(k, groups, freed, gained)
  if #groups == 0 then return end
  -- ringable[i]: a lane whose count is known, active[i] its slots after the call
  local ringable, active = {}, {}
  local drops = {}
  local unread = {} -- lanes that give back no slot: their counts are read
  for i = 1, #groups do
    local g = groups[i]
    local give_back = freed[g] or 0
    if give_back > 0 then
      local n = give_back_slots(k, g, give_back)
      if n ~= nil then
        if n <= 0 then
          drops[#drops + 1] = g
          n = 0 -- the field is deleted: the lane holds no slot from now on
        end
        local j = #ringable + 1
        ringable[j], active[j] = g, n
      end
    else
      unread[#unread + 1] = g
    end
  end
  if #drops > 0 then variadic('HDEL', k.gactive, drops, false) end
  if #unread > 0 then
    local counts = collect('HMGET', k.gactive, unread)
    for i = 1, #unread do
      local n = in_flight(counts[i])
      if n == nil then
        unsettle(k, k.gactive, unread[i], counts[i])
      else
        local j = #ringable + 1
        ringable[j], active[j] = unread[i], n
      end
    end
  end
  if #ringable == 0 then return end

  local open, open_active = {}, {}
  local paused = collect('SMISMEMBER', k.paused, ringable)
  for i = 1, #ringable do
    local g = ringable[i]
    -- a lane key of the wrong type (pcall) shows no work
    if paused[i] == 0
        and (gained[g] or has_work(redis.pcall('ZCARD', k.prefix .. 'g:' .. g .. ':pending'))) then
      local j = #open + 1
      open[j], open_active[j] = g, active[i]
    end
  end
  if #open == 0 then return end

  local under = {}
  local caps = collect('HMGET', k.glimit, open)
  for i = 1, #open do
    local g, cap_raw = open[i], caps[i]
    local cap = cap_raw and tonumber(cap_raw)
    if cap_raw and cap == nil then
      unsettle(k, k.glimit, g, cap_raw)
    elseif not cap or open_active[i] < cap then
      under[#under + 1] = g
    end
  end
  if #under == 0 then return end

  local ringed = {}
  local present = on_ring(k.ring, under)
  for i = 1, #under do
    local g = under[i]
    if not present[g] then ringed[#ringed + 1] = g end
  end
  if #ringed == 0 then return end
  variadic('RPUSH', k.ring, ringed, false)
  -- wake is trimmed to 64: more pushes than that would be trimmed away
  local wakes = {}
  for i = 1, math.min(#ringed, 64) do wakes[i] = '1' end
  redis.call('LPUSH', k.wake, unpack(wakes))
  redis.call('LTRIM', k.wake, '0', '63')
end
