#!lua flags=no-writes
-- morgue_scan: read-only view of a window of the morgue (list and stats).
-- Declared no-writes (line 1): called with EVALSHA_RO (lua.py), so a Redis user
-- with read-only key permissions (%R~emq:{q}:*), or a read-only replica, may run it.
--
-- KEYS[1] dead
-- ARGV[1] queue prefix 'emq:{q}:'
-- ARGV[2] 'index' (ARGV[3] = start rank) or 'lex' (ARGV[3] = '' from the
--         start, else the last id already seen; `dead` scores are all 0)
-- ARGV[4] count
--
-- Returns {rows, next} where each row is
--   {id, group, stalled, attempts, last_error, dead_at, state, problem}
-- (raw field values, nil when absent, but dead_at: the time of death as the
-- purge reads it (lib/death), nil when the entry is undated; `problem` names
-- a row that is missing or not a hash) and `next` is the cursor for the
-- following window, '' at the end. On a cluster whose slot is being migrated
-- a row that moved is never reported missing: the call is refused instead
-- (lib/refusals: read_refused, here), as the replay and the purge are.

-- @include chunked
-- @include counters
-- @include death
-- @include refusals
-- @include morgue_window

local prefix = ARGV[1]
local count = tonumber(ARGV[4])
require_sorted_set(KEYS[1], 'nothing was read or changed')
-- the ages shown are those an age purge would see: the same clock, the same rule
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ids
if ARGV[2] == 'index' then
  local start = tonumber(ARGV[3])
  ids = redis.call('ZRANGE', KEYS[1], start, start + count - 1)
else
  local min = '-'
  if ARGV[3] ~= '' then min = '(' .. ARGV[3] end
  ids = redis.call('ZRANGEBYLEX', KEYS[1], min, '+', 'LIMIT', 0, count)
end

local rows = {}
for i, id in ipairs(ids) do
  local key = prefix .. 'job:' .. id
  local f = redis.pcall('HMGET', key, 'group', 'stalled', 'attempts', 'last_error', 'dead_at', 'state',
    'dead_attempts')
  if f.err then
    -- a wrong type is an answer; any other refusal (a row not local while
    -- the slot migrates, the ACL) stops the call
    read_refused(f)
    local problem = 'malformed: job row is a ' .. redis.call('TYPE', key).ok .. ', not a hash'
    rows[i] = {id, false, false, false, false, false, false, problem}
  else
    local problem = false
    -- absent, or moved to the importing node while the slot migrates: asked
    -- with `dead` (lib/refusals, here), which refuses the call if it moved
    if not (f[1] or f[2] or f[3] or f[4] or f[5] or f[6] or f[7]) and not here(key) then
      problem = 'job row is missing'
    end
    local died = false
    if time_of_death(f[5], f[7], f[3], now) then died = f[5] end
    rows[i] = {id, f[1], f[2], f[3], f[4], died, f[6], problem}
  end
end

local next_cursor = ''
if #ids == count then
  if ARGV[2] == 'index' then
    next_cursor = tostring(tonumber(ARGV[3]) + count)
  else
    next_cursor = ids[#ids]
  end
end
return {rows, next_cursor}
