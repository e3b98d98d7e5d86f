-- One atomic picture of a whole queue, for the audit (test tool: it scans the
-- queue's rows and lanes, so it is O(queue size)).
-- KEYS: 1 pending, 2 active, 3 schedule, 4 dead, 5 ring, 6 gactive, 7 glimit,
--       8 paused, 9 wake
-- ARGV: 1 row key MATCH pattern, 2 lane key MATCH pattern,
--       3 row key stem, 4 lane key head, 5 lane key tail
local function scan(pattern)
  local found = {}
  local cursor = '0'
  repeat
    local page = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = page[1]
    for _, key in ipairs(page[2]) do found[#found + 1] = key end
  until cursor == '0'
  return found
end
-- rows, flat: id, key type, state, group, attempts, stalled, has group ('1'/'0')
local rows = {}
for _, key in ipairs(scan(ARGV[1])) do
  local id = string.sub(key, #ARGV[3] + 1)
  local f = redis.pcall('HMGET', key, 'state', 'group', 'attempts', 'stalled')
  local n = #rows
  if f.err then
    rows[n + 1], rows[n + 2] = id, redis.call('TYPE', key)['ok']
    rows[n + 3], rows[n + 4], rows[n + 5], rows[n + 6], rows[n + 7] = '', '', '', '', '0'
  else
    rows[n + 1], rows[n + 2], rows[n + 3] = id, 'hash', f[1] or ''
    rows[n + 4], rows[n + 5], rows[n + 6] = f[2] or '', f[3] or '', f[4] or ''
    rows[n + 7] = f[2] and '1' or '0'
  end
end
local lanes = {}
for _, key in ipairs(scan(ARGV[2])) do
  local g = string.sub(key, #ARGV[4] + 1, #key - #ARGV[5])
  lanes[#lanes + 1] = {g, redis.call('ZRANGE', key, 0, -1)}
end
return {
  redis.call('ZRANGE', KEYS[1], 0, -1),
  redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'),
  redis.call('ZRANGE', KEYS[3], 0, -1),
  redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES'),
  redis.call('LRANGE', KEYS[5], 0, -1),
  redis.call('HGETALL', KEYS[6]),
  redis.call('HGETALL', KEYS[7]),
  redis.call('SMEMBERS', KEYS[8]),
  redis.call('LLEN', KEYS[9]),
  rows,
  lanes,
}
