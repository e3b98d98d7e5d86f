-- EchoMQ's reaper (run by every consumer at the top of its loop): expired
-- leases go back to be claimed again, uncounted. Up to ARGV[4] ids of active
-- whose deadline is at or below the server's now, lowest deadline first:
-- out of active, into pending or (grouped) the lane's pending, the lane slot
-- released (gactive decremented, field deleted at 0) and the lane put back on
-- the ring with a wake push when it is not paused and under its limit;
-- state = pending. attempts and stalled are left alone, nothing is published.
-- Like EchoMQ's, it reads no row first: an id whose row is gone comes back
-- with a ghost row holding only state.
-- KEYS: 1 active, 2 pending, 3 ring, 4 gactive, 5 glimit, 6 paused, 7 wake
-- ARGV: 1 job key stem, 2 lane key head, 3 lane key tail, 4 most ids per call
-- Returns the ids reaped.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  local row = ARGV[1] .. id
  local g = redis.call('HGET', row, 'group')
  if g then
    local left = redis.call('HINCRBY', KEYS[4], g, -1)
    if left <= 0 then redis.call('HDEL', KEYS[4], g) end
    redis.call('ZADD', ARGV[2] .. g .. ARGV[3], 0, id)
    if redis.call('SISMEMBER', KEYS[6], g) == 0 then
      local cap = redis.call('HGET', KEYS[5], g)
      if (not cap or left < tonumber(cap)) and not redis.call('LPOS', KEYS[3], g) then
        redis.call('RPUSH', KEYS[3], g)
        redis.call('LPUSH', KEYS[7], '1')
        redis.call('LTRIM', KEYS[7], 0, 63)
      end
    end
  else
    redis.call('ZADD', KEYS[2], 0, id)
  end
  redis.call('HSET', row, 'state', 'pending')
end
return expired
