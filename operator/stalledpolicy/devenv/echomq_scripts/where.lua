-- Every place holding one id, and its row's state.
-- KEYS: 1 row, 2 pending, 3 active, 4 schedule, 5 dead
-- ARGV: 1 id, 2 lane key head, 3 lane key tail
local places = {}
local names = {'pending', 'active', 'schedule', 'dead'}
for i = 2, 5 do
  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then places[#places + 1] = names[i - 1] end
end
local state = false
local group = false
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  state = redis.call('HGET', KEYS[1], 'state')
  group = redis.call('HGET', KEYS[1], 'group')
  if group and redis.call('ZSCORE', ARGV[2] .. group .. ARGV[3], ARGV[1]) then
    places[#places + 1] = 'lane:' .. group
  end
end
return {places, state, group}
