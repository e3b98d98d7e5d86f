-- Resume a lane: back on the ring if it has work and spare capacity.
-- KEYS: 1 paused, 2 ring, 3 glimit, 4 gactive, 5 wake, 6 the lane's pending
-- ARGV: 1 group
redis.call('SREM', KEYS[1], ARGV[1])
if redis.call('ZCARD', KEYS[6]) > 0 then
  local lim = redis.call('HGET', KEYS[3], ARGV[1])
  local act = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
  if (not lim or act < tonumber(lim)) and not redis.call('LPOS', KEYS[2], ARGV[1]) then
    redis.call('RPUSH', KEYS[2], ARGV[1])
    redis.call('LPUSH', KEYS[5], '1')
    redis.call('LTRIM', KEYS[5], 0, 63)
  end
end
return 1
