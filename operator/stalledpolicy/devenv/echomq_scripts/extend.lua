-- Lease extension, token-fenced on attempts (EMQSTALE on mismatch).
-- EchoMQ's extend re-adds the id to active whatever set holds it now; with
-- ARGV[4] = '1' (strict) it only re-scores an id that is still in active.
-- KEYS: 1 active, 2 row
-- ARGV: 1 id, 2 token, 3 lease ms, 4 strict ('1' or '0')
-- Returns 1 extended, 0 not in active (strict), -1 row gone.
local att = redis.call('HGET', KEYS[2], 'attempts')
if not att then return -1 end
if att ~= ARGV[2] then
  return redis.error_reply('EMQSTALE extend token mismatch')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] == '1' then
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
  return 1
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
