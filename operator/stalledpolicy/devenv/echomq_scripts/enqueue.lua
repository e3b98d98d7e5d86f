-- EchoMQ-shaped admission (test model of a program we do not own).
-- KEYS: 1 row, 2 pending set (flat pending or the lane), 3 ring, 4 paused,
--       5 glimit, 6 gactive, 7 wake
-- ARGV: 1 id, 2 payload, 3 group ('' = flat)
-- Returns 1 enqueued, 0 duplicate id (the caller mints another).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local g = ARGV[3]
if g == '' then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'attempts', '0', 'payload', ARGV[2])
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
  return 1
end
redis.call('HSET', KEYS[1], 'state', 'pending', 'attempts', '0', 'payload', ARGV[2], 'group', g)
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if redis.call('SISMEMBER', KEYS[4], g) == 0 then
  local lim = redis.call('HGET', KEYS[5], g)
  local act = tonumber(redis.call('HGET', KEYS[6], g) or '0')
  if (not lim or act < tonumber(lim)) and not redis.call('LPOS', KEYS[3], g) then
    redis.call('RPUSH', KEYS[3], g)
    redis.call('LPUSH', KEYS[7], '1')
    redis.call('LTRIM', KEYS[7], 0, 63)
  end
end
return 1
