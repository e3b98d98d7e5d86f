-- Test helper: push leases into the past on the server clock, the state a
-- dead worker leaves behind. Only ids still in active are touched (XX).
-- KEYS: 1 active
-- ARGV: 1 ms into the past, 2.. ids (none = every id in active)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = now - tonumber(ARGV[1])
local changed = 0
if #ARGV == 1 then
  local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, id in ipairs(ids) do
    redis.call('ZADD', KEYS[1], 'XX', score, id)
  end
  return #ids
end
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', score, ARGV[i])
    changed = changed + 1
  end
end
return changed
