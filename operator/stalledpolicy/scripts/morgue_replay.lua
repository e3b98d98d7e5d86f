-- morgue_replay: move dead jobs back to where a worker claims them
-- (semantics: docs/scripts.md). One call is bounded by ARGV[6] / ARGV[7].
--
-- KEYS[1] dead  KEYS[2] pending  KEYS[3] ring  KEYS[4] gactive  KEYS[5] glimit
-- KEYS[6] paused  KEYS[7] wake  KEYS[8] sweeper:totals
-- ARGV[1] queue prefix 'emq:{q}:'
-- ARGV[2] dry run ('1' = decide and report, write nothing)
-- ARGV[3] lane filter: '' = every lane, else '=' .. lane ('=' alone = flat jobs)
-- ARGV[4] mode: 'ids' (ARGV[8..] are the ids) or 'scan' (walk `dead` in id order)
-- ARGV[5] scan cursor: '' = from the start, else the last id already examined
-- ARGV[6] scan window (ids examined by this call)
-- ARGV[7] most jobs replayed by this call
--
-- Returns {{id, lane, ...}, {id, reason, ...}, {missing ids}, next cursor, {problem, ...}}
-- where lane is '' for a flat job, next cursor is '' at the end of `dead` and
-- problems name shared keys of the wrong type met after the moves (guard).

-- @include chunked
-- @include counters
-- @include ghost
-- @include guard
-- @include lanes
-- @include refusals
-- @include elsewhere
-- @include morgue_window
-- @include text

local prefix = ARGV[1]
local dry = ARGV[2] == '1'
local filter = ARGV[3]
local mode = ARGV[4]
local max_replayed = tonumber(ARGV[7])

-- pending receives flat jobs after their rows are written; an error there
-- would leave them in no set, so a wrong type refuses the call before any write.
require_sorted_set(KEYS[2], 'nothing was replayed')

-- a lane whose key has the wrong type cannot take jobs back: '' = usable
local lane_problem = {}
local function lane_refusal(g)
  if lane_problem[g] == nil then
    local lane = prefix .. 'g:' .. g .. ':pending'
    local kind = 'none'
    if here(lane) then kind = redis.call('TYPE', lane).ok end
    lane_problem[g] = ''
    if kind ~= 'none' and kind ~= 'zset' then
      lane_problem[g] = lane_type_problem(prefix, g, kind)
    elseif refused({{'ZADD', lane, '0', 'x'}}) then
      lane_problem[g] = 'the Redis user may not write lane ' .. prefix .. 'g:' .. excerpt(g) .. ':pending (ACL)'
    end
  end
  return lane_problem[g]
end

local candidates, next_cursor = morgue_window(KEYS[1], mode, ARGV[5], tonumber(ARGV[6]), 8)
if not dry and #candidates > 0 then
  local id, row = candidates[1], prefix .. 'job:' .. candidates[1]
  require_permitted(prefix, {{'ZREM', KEYS[1], id}, {'HSET', row, 'state', 'pending'}, {'HDEL', row, 'stalled'},
    {'ZADD', KEYS[2], '0', id}, {'RPUSH', KEYS[3], 'g'}, {'LPUSH', KEYS[7], '1'}, {'LTRIM', KEYS[7], '0', '63'},
    {'HINCRBY', KEYS[8], 'replayed', '1'}}, 'nothing was replayed')
end

local replayed = {}
local kept = {}       -- id, why: left in `dead`
local missing = {}
local lanes = {}       -- group -> ids going back to the lane
local lane_order = {}
local flat = {}
local moves = {}       -- {id, row, last_error} of each job replayed, written after the reads

-- What each id of the window is, read before anything is decided (by position):
-- MISSING, a reason to keep it (false: not ours, a filtered scan's other lane),
-- or nil with its group and row to replay. The limit applies after, to the ids
-- that are replayed: an id kept must not use up a place.
local MISSING = {}  -- not in `dead` (ids mode)
local verdict, group_of, row_of = {}, {}, {}
local eligible, eligible_groups = {}, {}
for i, id in ipairs(candidates) do
  if mode == 'ids' and redis.call('ZSCORE', KEYS[1], id) == false then
    verdict[i] = MISSING
  else
    local row = prefix .. 'job:' .. id
    local f = redis.pcall('HMGET', row, 'group', 'attempts', 'state', 'last_error')
    local reason = nil
    local g = false
    -- a row that is missing or not a hash has no lane: why, or nil
    local laneless = nil
    if f.err then
      read_refused(f)
      laneless = 'malformed: job row is a ' .. redis.call('TYPE', row).ok .. ', not a hash'
    elseif not (f[1] or f[2] or f[3] or f[4]) and not here(row) then
      laneless = 'job row is missing'
    else
      g = f[1]
    end
    -- the lane filter first: it never selects a laneless row (as the purge)
    if filter ~= '' and (laneless or filter ~= '=' .. (g or '')) then
      if mode ~= 'ids' then
        reason = false
      elseif laneless then
        reason = 'in no lane (' .. laneless .. '), not selected'
      else
        reason = 'in lane ' .. (g and excerpt(g) or '(flat)') .. ', not selected'
      end
    elseif laneless then
      reason = laneless
    elseif g == '' then
      reason = 'malformed: group is empty'
    elseif f[3] and f[3] ~= 'dead' then
      reason = "state is '" .. excerpt(f[3]) .. "', not dead"
    elseif count_of(f[2]) == nil then
      reason = 'malformed: attempts is not a non-negative integer: ' .. excerpt(f[2])
    elseif f[2] == false and is_ghost(row) then
      reason = GHOST_ROW
    elseif g and lane_refusal(g) ~= '' then
      reason = lane_refusal(g)
    end
    verdict[i] = reason
    if reason == nil then
      group_of[i], row_of[i] = g, {row, f[4]}
      eligible[#eligible + 1] = id
      eligible_groups[#eligible] = g
    end
  end
end

-- An id that also waits where a worker claims it is kept: replayed, it would
-- wait twice (lib/elsewhere).
local found = waiting_elsewhere(prefix, eligible, eligible_groups)

local n = 0
local last_examined = ''
for i, id in ipairs(candidates) do
  if n >= max_replayed then
    -- stopped early: resume right after the last id examined
    if mode ~= 'ids' then next_cursor = last_examined end
    break
  end
  last_examined = id
  local reason = verdict[i]
  if reason == nil and found[id] then
    reason = 'also waits in ' .. found[id] .. ': replayed, it would run twice; to drop only the morgue entry: ZREM '
      .. KEYS[1] .. ' <id>'
  end
  if reason == MISSING then
    missing[#missing + 1] = id
  elseif reason == false then
    -- another lane's job (or a laneless row) met by a filtered scan: not ours this time
  elseif reason then
    -- kept in `dead` and reported: never dropped, never half-replayed
    -- (the reason may quote a row's bytes: made valid UTF-8)
    kept[#kept + 1] = id
    kept[#kept + 1] = readable(reason)
  else
    n = n + 1
    local g = group_of[i]
    replayed[#replayed + 1] = id
    replayed[#replayed + 1] = g or ''
    if not dry then
      moves[#moves + 1] = {id, row_of[i][1], row_of[i][2]}
      if g then
        if lanes[g] == nil then
          lanes[g] = {}
          lane_order[#lane_order + 1] = g
        end
        local ids = lanes[g]
        ids[#ids + 1] = id
      else
        flat[#flat + 1] = id
      end
    end
  end
end

-- Every row and lane key was read above, before this first write: a key
-- Redis refuses to read (on a cluster whose slot is being migrated: one
-- already moved to the other node) stopped the call with nothing replayed,
-- where an error half-way would have left jobs out of `dead` and in no other
-- set (lib/refusals, read_refused).
local problems = {}
if not dry then
  for _, move in ipairs(moves) do
    local id, row, last_error = move[1], move[2], move[3]
    redis.call('ZREM', KEYS[1], id)
    if last_error then
      redis.call('HSET', row, 'state', 'pending', 'previous_error', last_error)
    else
      redis.call('HSET', row, 'state', 'pending')
    end
    redis.call('HDEL', row, 'stalled', 'last_error', 'dead_at', 'dead_attempts')
  end
  if #flat > 0 then variadic('ZADD', KEYS[2], flat, true) end
  for _, g in ipairs(lane_order) do
    variadic('ZADD', prefix .. 'g:' .. g .. ':pending', lanes[g], true)
  end
  -- no slot freed: a replayed job was not in flight
  local unsettled = {}
  guarded(problems, {KEYS[4], 'hash', KEYS[6], 'set', KEYS[5], 'hash', KEYS[3], 'list', KEYS[7], 'list'},
    "the replayed lanes were not (all) put back on the ring",
    settle_lanes, {prefix = prefix, ring = KEYS[3], paused = KEYS[6], glimit = KEYS[5],
      gactive = KEYS[4], wake = KEYS[7], unsettled = unsettled}, lane_order, {}, lanes)
  unsettled_problems(problems, KEYS[4], unsettled)
  if #moves > 0 then
    guarded(problems, {KEYS[8], 'hash'}, "this call's replays were not counted", add_counts, KEYS[8],
      {'replayed', #moves})
  end
end

return {replayed, kept, missing, next_cursor, problems}
