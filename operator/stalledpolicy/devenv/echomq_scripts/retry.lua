-- Failure: back to schedule after a delay, or to dead once attempts reach the
-- maximum. Token-fenced like completion.
-- KEYS: 1 active, 2 schedule, 3 dead, 4 row, 5 pending, 6 ring, 7 gactive,
--       8 glimit, 9 paused, 10 wake, 11 metrics:failed
-- ARGV: 1 id, 2 token, 3 delay ms, 4 max attempts, 5 error,
--       6 lane key head, 7 lane key tail
-- Returns 'scheduled' or 'dead'.
local att = redis.call('HGET', KEYS[4], 'attempts')
if not att then return redis.error_reply('EMQSTALE job gone') end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE retry token mismatch')
end
local g = redis.call('HGET', KEYS[4], 'group')
local was_active = redis.call('ZREM', KEYS[1], ARGV[1])
if g then
  local lane = ARGV[6] .. g .. ARGV[7]
  if was_active == 1 then
    local act = redis.call('HINCRBY', KEYS[7], g, -1)
    if act <= 0 then redis.call('HDEL', KEYS[7], g) end
    if redis.call('SISMEMBER', KEYS[9], g) == 0 and redis.call('ZCARD', lane) > 0 then
      local lim = redis.call('HGET', KEYS[8], g)
      if (not lim or act < tonumber(lim)) and not redis.call('LPOS', KEYS[6], g) then
        redis.call('RPUSH', KEYS[6], g)
        redis.call('LPUSH', KEYS[10], '1')
        redis.call('LTRIM', KEYS[10], 0, 63)
      end
    end
  else
    redis.call('ZREM', lane, ARGV[1])
    if redis.call('ZCARD', lane) == 0 then redis.call('LREM', KEYS[6], 0, g) end
  end
elseif was_active == 0 then
  redis.call('ZREM', KEYS[5], ARGV[1])
end
redis.call('HSET', KEYS[4], 'last_error', ARGV[5])
if tonumber(att) >= tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[4], 'state', 'dead')
  redis.call('ZADD', KEYS[3], 0, ARGV[1])
  redis.call('HINCRBY', KEYS[11], 'count', 1)
  return 'dead'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[4], 'state', 'scheduled')
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
return 'scheduled'
