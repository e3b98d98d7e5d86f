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
-- ARGV[2] may also be, both walking `dead` by id cursor as 'lex' does:
--   'lane'  (list --lane) ARGV[5] the lane ('' = flat jobs), ARGV[6] matching
--           rows to pass over first (the page's offset still to skip), ARGV[7]
--           the most rows wanted (0: none, only count), ARGV[8] 'total' to
--           examine the whole window even once the rows are found (the lane's
--           total comes from the same walk), else ''. Only that lane's rows are
--           returned, by the engine's rule (lane_of): a row missing or not a
--           hash is in no lane. Returns {rows, next, skipped, matched}, matched
--           the lane's rows among the ids examined (up to next); without
--           'total' the walk stops early once ARGV[7] rows are found (next =
--           the last id examined).
--   'stats' Returns {lanes, unreadable, oldest, next}: lanes a flat list
--           group, n, ... ('' = flat jobs), unreadable the rows missing or not
--           a hash (in no lane), oldest the earliest time of death among the
--           rest (false when none is dated). Only these aggregates cross the
--           wire, so a caller may send a larger count (each call stays short).
--
-- Returns ('index', 'lex') {rows, next} where each row is
--   {id, group, stalled, attempts, last_error, dead_at, state, problem, warning}
-- (raw field values, nil when absent, but dead_at: the time of death as the
-- purge reads it (lib/death), nil when the entry is undated; `problem` names
-- a row that is missing or not a hash, `warning` a ghost row (lib/ghost),
-- which the replay refuses, or else a flow child) and `next` is the cursor for the
-- following window, '' at the end. On a cluster whose slot is being migrated
-- a row that moved is never reported missing: the call is refused instead
-- (lib/refusals: read_refused, here), as the replay and the purge are.

-- @include chunked
-- @include counters
-- @include death
-- @include ghost
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

local fields = {'group', 'stalled', 'attempts', 'last_error', 'dead_at', 'state', 'dead_attempts', 'parent'}

-- A child of an EchoMQ flow (its row names a `parent`; flows are not in the
-- wire contract): EchoMQ's retry fails or releases the parent when a child
-- dies at its last attempt, a dead-letter by the sweep does not (README, flows)
local FLOW_CHILD = 'flow child: its parent job waits for it (a dead-letter by the sweep does not fail or '
  .. "release the parent, as EchoMQ's retry does); replay it to let the parent go on"

-- the row of one id as 'index' and 'lex' return it
local function row_of(id, key)
  local f = redis.pcall('HMGET', key, unpack(fields))
  if f.err then
    -- a wrong type is an answer; any other refusal (a row not local while
    -- the slot migrates, the ACL) stops the call
    read_refused(f)
    local problem = 'malformed: job row is a ' .. redis.call('TYPE', key).ok .. ', not a hash'
    return {id, false, false, false, false, false, false, problem, false}
  end
  local problem, warning = false, false
  -- absent, or moved to the importing node while the slot migrates: asked
  -- with `dead` (lib/refusals, here), which refuses the call if it moved
  if not (f[1] or f[2] or f[3] or f[4] or f[5] or f[6] or f[7] or f[8]) and not here(key) then
    problem = 'job row is missing'
  elseif f[3] == false and is_ghost(key) then
    warning = GHOST_ROW  -- a hash: in its lane (flat) as for the replay and the purge
  elseif f[8] then
    warning = FLOW_CHILD
  end
  local died = false
  if time_of_death(f[5], f[7], f[3], now) then died = f[5] end
  return {id, f[1], f[2], f[3], f[4], died, f[6], problem, warning}
end

local function cursor_after(last)
  if #ids == count then return last end
  return ''
end

if ARGV[2] == 'stats' then
  local lanes, order, unreadable, oldest = {}, {}, 0, false
  for _, id in ipairs(ids) do
    local key = prefix .. 'job:' .. id
    local f = redis.pcall('HMGET', key, 'group', 'attempts', 'dead_at', 'dead_attempts')
    local lane = nil
    if f.err then
      read_refused(f)  -- not a hash: in no lane
    elseif f[1] or f[2] or f[3] or f[4] or here(key) then
      -- a hash (the fields 'list' reads but these four prove it exists as well)
      lane = f[1] or ''
      local died = time_of_death(f[3], f[4], f[2], now)
      if died and (not oldest or died < oldest) then oldest = died end
    end
    if lane == nil then
      unreadable = unreadable + 1
    elseif lanes[lane] then
      lanes[lane] = lanes[lane] + 1
    else
      lanes[lane] = 1
      order[#order + 1] = lane
    end
  end
  local flat = {}
  for _, lane in ipairs(order) do
    flat[#flat + 1] = lane
    flat[#flat + 1] = lanes[lane]
  end
  return {flat, unreadable, oldest, cursor_after(ids[#ids])}
end

if ARGV[2] == 'lane' then
  local lane, skip, want, to_end = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == 'total'
  local rows, skipped, matched, last = {}, 0, 0, nil
  for _, id in ipairs(ids) do
    last = id
    local key = prefix .. 'job:' .. id
    -- two fields only: a row of another lane costs one HMGET, and so does one
    -- of the lane that is only skipped or counted; row_of reads the page's
    -- rows. `state` (every EchoMQ row has one) proves the row is there when
    -- it has no `group`: a flat job
    local f = redis.pcall('HMGET', key, 'group', 'state')
    local member
    if f.err then
      read_refused(f)
      member = false  -- not a hash: in no lane
    elseif f[1] or f[2] or here(key) then
      -- a hash: its lane ('' = flat). Absence is asked with `dead` (here), as
      -- row_of and stats ask it: while the slot migrates, a row not moved yet
      -- reads as absent on the importing node, and must not drop out of the
      -- lane unseen; the call is refused instead
      member = (f[1] or '') == lane
    else
      member = false  -- missing: in no lane
    end
    if member then
      matched = matched + 1
      if skipped < skip then
        skipped = skipped + 1
      elseif #rows < want then
        rows[#rows + 1] = row_of(id, key)
        if #rows >= want and not to_end then
          return {rows, id, skipped, matched}
        end
      end
    end
  end
  return {rows, cursor_after(last), skipped, matched}
end

local rows = {}
for i, id in ipairs(ids) do
  rows[i] = row_of(id, prefix .. 'job:' .. id)
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
