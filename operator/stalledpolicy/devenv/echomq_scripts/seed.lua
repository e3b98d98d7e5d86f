-- Test/demo/bench helper: claimed jobs whose worker died, in bulk. Each job
-- gets its row (state active, its token, optional group and stalled mark), an
-- entry in active at the given (past) deadline, and its lane slot in gactive.
-- KEYS: 1 active, 2 gactive
-- ARGV: 1 job key stem, 2 lease deadline (ms), 3 payload, 4 attempts,
--       5.. triples: id, group ('' = flat), stalled ('' = no field)
local slots = {}
local lanes = {}
for i = 5, #ARGV, 3 do
  local id, g, stalled = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local row = ARGV[1] .. id
  redis.call('HSET', row, 'state', 'active', 'attempts', ARGV[4], 'payload', ARGV[3])
  if g ~= '' then
    redis.call('HSET', row, 'group', g)
    if slots[g] == nil then
      slots[g] = 0
      lanes[#lanes + 1] = g
    end
    slots[g] = slots[g] + 1
  end
  if stalled ~= '' then redis.call('HSET', row, 'stalled', stalled) end
  redis.call('ZADD', KEYS[1], ARGV[2], id)
end
for _, g in ipairs(lanes) do
  redis.call('HINCRBY', KEYS[2], g, slots[g])
end
return (#ARGV - 4) / 3
