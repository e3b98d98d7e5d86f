-- holds: the sweep's hold on a lease in its last moments, so that a lapse is
-- counted before EchoMQ's reapers can return it uncounted (docs/echomq.md,
-- "Holding a lapsing lease"; docs/scripts.md, sweep).
--
-- A lease due within `lead` ms is held: its score in `active` moves from its
-- deadline D to D + hold + 0.5, and D (with the row's attempts, the token) is
-- kept in our `sweeper:holds` / `sweeper:hold-tokens`. EchoMQ writes whole
-- milliseconds only, so a score with a half is ours and still held: a worker's
-- lease extension (a whole score), complete or retry (the id leaves `active`)
-- ends the hold without a stall. A reaper cannot see a held lease before
-- D + hold; when D comes, the sweep puts the score back to D, where the same
-- call counts the lapse. A sweeper that stops holding delays the reapers'
-- floor by `hold` ms at most.
--
--   settle_holds(k, now, limit, hold_ms) -> restored, uncounted, left
--   take_holds(k, now, limit, lead_ms, hold_ms) -> taken
--   earliest_event(hold_score, lease_score, lead_ms) -> the sooner of a hold
--                                  deadline and a lease's lead, -1 when none
--   next_event(k, now, lead_ms) -> ms (server clock) of the next deadline to
--                                  hold or count, or -1 when none
--
-- k: {active, holds, tokens, prefix}. `left`: due holds this call had no room
-- for (the batch is full); the caller calls again.

local function hold_score(deadline, hold_ms)
  return string.format('%.1f', deadline + hold_ms + 0.5)
end

local function is_held(score)
  return score ~= false and tonumber(score) % 1 ~= 0
end

-- A hold that ended without our stall, found after the reapers could act
-- (D + hold passed): the job lapsed uncounted when a reaper returned it (now
-- pending) or a worker claimed it again since (its token moved on). A worker's
-- complete (no row), retry or delay (scheduled or dead) is no lapse.
local function lapsed_uncounted(prefix, id, token)
  local f = redis.pcall('HMGET', prefix .. 'job:' .. id, 'state', 'attempts')
  if f.err or f[1] == false then return false end
  local state, attempts = f[1], f[2]
  if state == 'scheduled' or state == 'dead' then return false end
  return state == 'pending' or (token ~= false and token ~= '' and attempts ~= token)
end

local function settle_holds(k, now, limit, hold_ms)
  local due = redis.call('ZRANGEBYSCORE', k.holds, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  if #due == 0 then return 0, 0, false end
  -- restored leases join this call's batch: no more than it has room for
  local room = limit - redis.call('ZCOUNT', k.active, '-inf', now)
  local restored, uncounted, left = 0, 0, false
  for i = 1, #due, 2 do
    local id, deadline = due[i], tonumber(due[i + 1])
    local score = redis.call('ZSCORE', k.active, id)
    if is_held(score) then
      if room <= 0 then
        left = true
        break
      end
      redis.call('ZADD', k.active, 'XX', string.format('%d', deadline), id)
      restored = restored + 1
      room = room - 1
    elseif now > deadline + hold_ms and lapsed_uncounted(k.prefix, id, redis.call('HGET', k.tokens, id)) then
      uncounted = uncounted + 1
    end
    redis.call('ZREM', k.holds, id)
    redis.call('HDEL', k.tokens, id)
  end
  if not left and #due == 2 * limit then
    left = redis.call('ZCOUNT', k.holds, '-inf', now) > 0
  end
  return restored, uncounted, left
end

local function take_holds(k, now, limit, lead_ms, hold_ms)
  local soon = redis.call('ZRANGEBYSCORE', k.active, '(' .. string.format('%d', now),
    string.format('%d', now + lead_ms), 'WITHSCORES', 'LIMIT', 0, limit)
  local taken = 0
  for i = 1, #soon, 2 do
    local id, score = soon[i], soon[i + 1]
    local deadline = tonumber(score)
    if deadline % 1 == 0 then
      local token = redis.pcall('HGET', k.prefix .. 'job:' .. id, 'attempts')
      if type(token) ~= 'string' then token = '' end
      redis.call('ZADD', k.holds, score, id)
      redis.call('HSET', k.tokens, id, token)
      redis.call('ZADD', k.active, 'XX', hold_score(deadline, hold_ms), id)
      taken = taken + 1
    end
  end
  return taken
end

-- The sooner of the first hold's deadline and the lead of the lowest lease
-- (scores as ZRANGE ... WITHSCORES replies them; false: none), -1 when neither.
local function earliest_event(hold_score, lease_score, lead_ms)
  local nxt = -1
  if hold_score then nxt = tonumber(hold_score) end
  if lease_score then
    local at = math.floor(tonumber(lease_score)) - lead_ms
    if nxt < 0 or at < nxt then nxt = at end
  end
  return nxt
end

local function next_event(k, now, lead_ms)
  local first_hold = redis.call('ZRANGE', k.holds, 0, 0, 'WITHSCORES')
  -- the lowest lease above now: held ones come back through their hold above
  -- (waking early only costs a call)
  local first = redis.call('ZRANGEBYSCORE', k.active, '(' .. string.format('%d', now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  return earliest_event(first_hold[2] or false, first[2] or false, lead_ms)
end
