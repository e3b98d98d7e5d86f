-- morgue_purge: delete dead jobs for good (semantics: docs/scripts.md).
-- One call examines at most ARGV[7] ids.
--
-- KEYS[1] dead  KEYS[2] sweeper:totals
-- ARGV[1] queue prefix 'emq:{q}:'
-- ARGV[2] dry run ('1' = decide and report, write nothing)
-- ARGV[3] lane filter: '' = every lane, else '=' .. lane ('=' alone = flat jobs)
-- ARGV[4] mode: 'ids' (ARGV[8..] are the ids) or 'scan' (walk `dead` in id order)
-- ARGV[5] minimum age in ms on the server clock, from the row's time of death
--         (lib/death: dead_at, while dead_attempts is the row's attempts;
--         '' = any age)
-- ARGV[6] scan cursor: '' = from the start, else the last id already examined
-- ARGV[7] scan window
--
-- Returns {{purged ids}, {id, reason, ...} kept, {missing ids}, undated, next cursor,
--          {problem, ...}, undatable, {lane, ...}} (problems: see guard; the
-- lanes, one per purged id in the same order: '=' .. group for a job of a
-- lane, '=' for a flat job, '' for a row that is missing or not a hash, which
-- is in no lane). An age purge keeps
-- the entries it cannot age: undated counts the existing hash rows without a
-- time of death (lib/death), which it stamps with now (dead_at, and
-- dead_attempts from the row's attempts);
-- undatable the rows that are missing or not a hash (nothing to stamp: only
-- a purge without an age removes them).

-- @include chunked
-- @include counters
-- @include death
-- @include guard
-- @include refusals
-- @include elsewhere
-- @include morgue_window
-- @include text

local prefix = ARGV[1]
local dry = ARGV[2] == '1'
local filter = ARGV[3]
local mode = ARGV[4]
local min_age = tonumber(ARGV[5])

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local now_s = string.format('%d', now)

local candidates, next_cursor = morgue_window(KEYS[1], mode, ARGV[6], tonumber(ARGV[7]), 8)
if not dry and #candidates > 0 then
  local id, row = candidates[1], prefix .. 'job:' .. candidates[1]
  local checks = {{'ZREM', KEYS[1], id}, {'DEL', row}, {'HINCRBY', KEYS[2], 'purged', '1'}}
  if min_age then checks[#checks + 1] = {'HSET', row, 'dead_at', now_s} end -- only an age purge dates
  require_permitted(prefix, checks, 'nothing was purged or dated')
end

local purged = {}
local purged_lanes = {}  -- as the lane filter reads them: '=' .. group, '' = in no lane
local kept = {}
local missing = {}
local undated = 0
local undatable = 0
local stamps = {}  -- rows an age purge dates (written after the reads)
local marks = {}   -- their dead_attempts, by position in stamps

for _, id in ipairs(candidates) do
  if mode == 'ids' and redis.call('ZSCORE', KEYS[1], id) == false then
    missing[#missing + 1] = id
  else
    local row = prefix .. 'job:' .. id
    local f = redis.pcall('HMGET', row, 'group', 'dead_at', 'state', 'attempts', 'dead_attempts')
    if f.err then read_refused(f) end
    local is_hash = not f.err
    local g, dead_at, state, attempts, mark = false, false, false, false, false
    if is_hash then g, dead_at, state, attempts, mark = f[1], f[2], f[3], f[4], f[5] end
    -- a hash row holding none of the five may be missing (asked once; a row
    -- absent here while the slot migrates stops the call: refusals, here)
    local present = is_hash
    if is_hash and not (g or dead_at or state or attempts or mark) then present = here(row) end
    local reason = nil  -- nil = purge, false = not selected (silent), string = kept, reported
    if filter ~= '' then
      -- a row that is missing or not a hash has no lane: no lane filter selects it
      if not present or filter ~= '=' .. (g or '') then
        if mode == 'ids' then reason = 'not in the selected lane' else reason = false end
      end
    end
    if reason == nil and state and state ~= 'dead' then
      -- listed in dead but the row says it lives elsewhere: deleting it would drop a job
      reason = "state is '" .. excerpt(state) .. "', not dead"
    end
    if reason == nil and min_age then
      -- lib/death: a dead_at that is no counter, later than now, without its
      -- dead_attempts or from before a later claim (EchoMQ reprocessed the
      -- job and it died again) is no time of death
      local died = time_of_death(dead_at, mark, attempts, now)
      if died == nil then
        if present then
          -- undated (dead-lettered by EchoMQ itself, a malformed, future or
          -- stale value): the age starts now, stamped on the row with the
          -- attempts it belongs to; a later purge can remove it
          undated = undated + 1
          if not dry then
            stamps[#stamps + 1] = row
            marks[#stamps] = death_mark(attempts)
          end
        else
          -- missing, or not a hash: nothing to stamp, never dated
          undatable = undatable + 1
        end
        reason = false
      elseif now - died < min_age then
        reason = false
      end
    end
    if reason == nil then
      purged[#purged + 1] = id
      purged_lanes[#purged] = present and ('=' .. (g or '')) or ''
    elseif reason then
      kept[#kept + 1] = id
      kept[#kept + 1] = readable(reason) -- it may quote the row's state
    end
  end
end

-- An id that also waits where a worker claims it is kept: its row is the job's.
if #purged > 0 then
  local groups = {}
  for i, lane in ipairs(purged_lanes) do
    groups[i] = lane ~= '' and lane ~= '=' and string.sub(lane, 2)
  end
  local found = waiting_elsewhere(prefix, purged, groups)
  if next(found) ~= nil then
    local still, still_lanes = {}, {}
    for i, id in ipairs(purged) do
      if found[id] then
        kept[#kept + 1] = id
        kept[#kept + 1] = readable('also waits in ' .. found[id] .. ': purged, its row would go and a worker '
          .. 'would claim the id without it; to drop only the morgue entry: ZREM ' .. KEYS[1] .. ' <id>')
      else
        still[#still + 1] = id
        still_lanes[#still] = purged_lanes[i]
      end
    end
    purged, purged_lanes = still, still_lanes
  end
end

-- The purged jobs' log lines (job:<id>:logs, EchoMQ's add_log) go with their
-- rows. Asked together with `dead` (as here() asks): while the slot migrates,
-- a key already moved (or never there) refuses the call now, with nothing
-- changed, rather than leaving lines behind that no job names.
local logs = {}
if not dry then
  for i, id in ipairs(purged) do logs[i] = prefix .. 'job:' .. id .. ':logs' end
  if #logs > 0 then variadic('EXISTS', KEYS[1], logs, false) end
end

-- Every row was read above, before this first write: a row Redis refuses to
-- read (on a cluster whose slot is being migrated: one already moved to the
-- other node) stopped the call with nothing changed (lib/refusals,
-- read_refused), not half-way with the call's purges done but not counted.
-- The deletions go first: over maxmemory (noeviction), Redis refuses a
-- command that may grow memory (HSET) as a script's first write, and a purge
-- is what frees memory. A call that deletes nothing may be refused its first
-- date so: nothing is written then, and the call goes on to the next window
-- (the entries stay undated; a later age purge dates them).
local problems = {}
if not dry then
  local kept_logs, refusal = 0, nil
  for i, id in ipairs(purged) do
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', prefix .. 'job:' .. id)
    -- and its log lines, as EchoMQ's own remove_job deletes them. A refusal
    -- (ACL: the user may not write them) stops nothing: they stay, reported.
    local deleted = redis.pcall('DEL', logs[i])
    if type(deleted) == 'table' and deleted.err then
      kept_logs, refusal = kept_logs + 1, deleted.err
    end
  end
  if kept_logs > 0 then
    problems[#problems + 1] = 'the log lines (' .. prefix .. 'job:<id>:logs) of ' .. kept_logs
      .. ' purged job(s) were not deleted (' .. refusal .. '); delete them, or let the Redis user write them'
  end
  for i, row in ipairs(stamps) do
    local stamped = redis.pcall('HSET', row, 'dead_at', now_s, 'dead_attempts', marks[i])
    if type(stamped) == 'table' and stamped.err then
      if #purged > 0 or not string.find(stamped.err, '^OOM ') then error(stamped) end
      problems[#problems + 1] = 'entries without a time of death were not dated (' .. stamped.err
        .. '); a later age purge dates them'
      break
    end
  end
end

if not dry and #purged > 0 then
  guarded(problems, {KEYS[2], 'hash'}, "this call's purges were not counted", add_counts, KEYS[2], {'purged', #purged})
end

return {purged, kept, missing, undated, next_cursor, problems, undatable, purged_lanes}
