-- Flat claim: pop the lowest id of pending, attempts += 1 (the fencing token),
-- state = active, lease on the server clock.
-- KEYS: 1 pending, 2 active
-- ARGV: 1 job key stem, 2 lease ms
local popped = redis.call('ZPOPMIN', KEYS[1])
if #popped == 0 then return {} end
local id = popped[1]
local row = ARGV[1] .. id
local token = redis.call('HINCRBY', row, 'attempts', 1)
redis.call('HSET', row, 'state', 'active')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), id)
return {id, token, redis.call('HGET', row, 'payload') or ''}
