-- Set a lane's concurrency limit; the ring follows the new limit.
-- KEYS: 1 glimit, 2 gactive, 3 ring, 4 paused, 5 wake, 6 the lane's pending
-- ARGV: 1 group, 2 limit
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local act = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if act >= tonumber(ARGV[2]) then
  redis.call('LREM', KEYS[3], 0, ARGV[1])
elseif redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 0 and redis.call('ZCARD', KEYS[6]) > 0
    and not redis.call('LPOS', KEYS[3], ARGV[1]) then
  redis.call('RPUSH', KEYS[3], ARGV[1])
  redis.call('LPUSH', KEYS[5], '1')
  redis.call('LTRIM', KEYS[5], 0, 63)
end
return 1
