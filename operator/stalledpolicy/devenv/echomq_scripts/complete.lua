-- Completion, as EchoMQ does it: the only fence is attempts == token. A job
-- no longer in active (recovered by a sweep, not yet re-claimed) is taken out
-- of its pending set; the row is deleted either way.
-- KEYS: 1 active, 2 row, 3 pending, 4 ring, 5 gactive, 6 glimit, 7 paused,
--       8 wake, 9 metrics:completed
-- ARGV: 1 id, 2 token, 3 lane key head, 4 lane key tail
-- Returns 1 completed, 0 row gone.
local att = redis.call('HGET', KEYS[2], 'attempts')
if not att then return 0 end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE complete token mismatch')
end
local g = redis.call('HGET', KEYS[2], 'group')
local was_active = redis.call('ZREM', KEYS[1], ARGV[1])
if g then
  local lane = ARGV[3] .. g .. ARGV[4]
  if was_active == 1 then
    local act = redis.call('HINCRBY', KEYS[5], g, -1)
    if act <= 0 then redis.call('HDEL', KEYS[5], g) end
    if redis.call('SISMEMBER', KEYS[7], g) == 0 and redis.call('ZCARD', lane) > 0 then
      local lim = redis.call('HGET', KEYS[6], g)
      if (not lim or act < tonumber(lim)) and not redis.call('LPOS', KEYS[4], g) then
        redis.call('RPUSH', KEYS[4], g)
        redis.call('LPUSH', KEYS[8], '1')
        redis.call('LTRIM', KEYS[8], 0, 63)
      end
    end
  else
    redis.call('ZREM', lane, ARGV[1])
    if redis.call('ZCARD', lane) == 0 then redis.call('LREM', KEYS[4], 0, g) end
  end
elseif was_active == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
redis.call('DEL', KEYS[2])
redis.call('HINCRBY', KEYS[9], 'count', 1)
return 1
