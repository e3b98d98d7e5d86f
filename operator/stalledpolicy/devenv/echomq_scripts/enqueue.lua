-- EchoMQ-shaped admission (test model of a program we do not own) of one or
-- more jobs with the same payload into the same place.
-- KEYS: 1 pending set (flat pending or the lane), 2 ring, 3 paused, 4 glimit,
--       5 gactive, 6 wake
-- ARGV: 1 job key stem, 2 payload, 3 group ('' = flat), 4.. ids
-- Returns the ids admitted (a duplicate id is refused; the caller mints again).
local g = ARGV[3]
local admitted = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local row = ARGV[1] .. id
  if redis.call('EXISTS', row) == 0 then
    if g == '' then
      redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'payload', ARGV[2])
    else
      redis.call('HSET', row, 'state', 'pending', 'attempts', '0', 'payload', ARGV[2], 'group', g)
    end
    redis.call('ZADD', KEYS[1], 0, id)
    admitted[#admitted + 1] = id
  end
end
if g ~= '' and #admitted > 0 and redis.call('SISMEMBER', KEYS[3], g) == 0 then
  local lim = redis.call('HGET', KEYS[4], g)
  local act = tonumber(redis.call('HGET', KEYS[5], g) or '0')
  if (not lim or act < tonumber(lim)) and not redis.call('LPOS', KEYS[2], g) then
    redis.call('RPUSH', KEYS[2], g)
    redis.call('LPUSH', KEYS[6], '1')
    redis.call('LTRIM', KEYS[6], 0, 63)
  end
end
return admitted
