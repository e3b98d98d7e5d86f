-- Due scheduled jobs back to pending (or their lane, with the ring/wake rule).
-- KEYS: 1 schedule, 2 pending, 3 ring, 4 gactive, 5 glimit, 6 paused, 7 wake
-- ARGV: 1 job key stem, 2 lane key head, 3 lane key tail, 4 batch
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local row = ARGV[1] .. id
  local g = redis.call('HGET', row, 'group')
  if g then
    redis.call('ZADD', ARGV[2] .. g .. ARGV[3], 0, id)
    if redis.call('SISMEMBER', KEYS[6], g) == 0 then
      local lim = redis.call('HGET', KEYS[5], g)
      local act = tonumber(redis.call('HGET', KEYS[4], g) or '0')
      if (not lim or act < tonumber(lim)) and not redis.call('LPOS', KEYS[3], g) then
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
return #due
