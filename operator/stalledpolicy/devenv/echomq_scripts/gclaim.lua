-- Grouped claim: rotate the ring one step and serve that lane's head. Like
-- EchoMQ, it trusts the ring (only serviceable lanes are on it): it does not
-- re-check pause or limit, it drops the lane from the ring once the lane is
-- empty or reaches its limit.
-- KEYS: 1 ring, 2 active, 3 gactive, 4 glimit
-- ARGV: 1 job key stem, 2 lane key head, 3 lane key tail, 4 lease ms
-- Returns {id, token, payload, group}, {} when the ring is empty, or
-- {'', 0, '', group} when the rotated lane was empty (dropped; try again).
local g = redis.call('LMOVE', KEYS[1], KEYS[1], 'LEFT', 'RIGHT')
if not g then return {} end
local lane = ARGV[2] .. g .. ARGV[3]
local popped = redis.call('ZPOPMIN', lane)
if #popped == 0 then
  redis.call('LREM', KEYS[1], 0, g)
  return {'', 0, '', g}
end
local id = popped[1]
local row = ARGV[1] .. id
local token = redis.call('HINCRBY', row, 'attempts', 1)
redis.call('HSET', row, 'state', 'active')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), id)
local act = redis.call('HINCRBY', KEYS[3], g, 1)
local lim = redis.call('HGET', KEYS[4], g)
if (lim and act >= tonumber(lim)) or redis.call('ZCARD', lane) == 0 then
  redis.call('LREM', KEYS[1], 0, g)
end
return {id, token, redis.call('HGET', row, 'payload') or '', g}
