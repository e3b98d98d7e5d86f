-- Completion, as EchoMQ does it: the only fence is attempts == token. A job
-- no longer in active (recovered by a sweep, not yet re-claimed) is taken out
-- of its pending set; the row is deleted either way.
-- KEYS: 1 active, 2 row, 3 pending, 4 ring, 5 gactive, 6 glimit, 7 paused,
--       8 wake, 9 metrics:completed
-- ARGV: 1 id, 2 token, 3 lane key head, 4 lane key tail
-- Returns 1 completed, 0 row gone.
-- @include leave_place
local att = redis.call('HGET', KEYS[2], 'attempts')
if not att then return 0 end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE complete token mismatch')
end
local g = redis.call('HGET', KEYS[2], 'group')
local was_active = redis.call('ZREM', KEYS[1], ARGV[1])
local lane = g and (ARGV[3] .. g .. ARGV[4])
leave_place(ARGV[1], g, was_active, lane, KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('DEL', KEYS[2])
redis.call('HINCRBY', KEYS[9], 'count', 1)
return 1
