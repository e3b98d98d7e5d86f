-- Failure: back to schedule after a delay, or to dead once attempts reach the
-- maximum. Token-fenced like completion.
-- KEYS: 1 active, 2 schedule, 3 dead, 4 row, 5 pending, 6 ring, 7 gactive,
--       8 glimit, 9 paused, 10 wake, 11 metrics:failed
-- ARGV: 1 id, 2 token, 3 delay ms, 4 max attempts, 5 error,
--       6 lane key head, 7 lane key tail
-- Returns 'scheduled' or 'dead'.
-- @include leave_place
local att = redis.call('HGET', KEYS[4], 'attempts')
if not att then return redis.error_reply('EMQSTALE job gone') end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE retry token mismatch')
end
local g = redis.call('HGET', KEYS[4], 'group')
local was_active = redis.call('ZREM', KEYS[1], ARGV[1])
local lane = g and (ARGV[6] .. g .. ARGV[7])
leave_place(ARGV[1], g, was_active, lane, KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10])
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
