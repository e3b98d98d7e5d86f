-- sweep: the counted mark / recover / dead-letter walk over the expired prefix
-- of `active` (semantics: docs/scripts.md). One call is bounded by ARGV[2].
--
-- KEYS[1] active   KEYS[2] pending  KEYS[3] dead      KEYS[4] ring
-- KEYS[5] gactive  KEYS[6] glimit   KEYS[7] paused    KEYS[8] wake
-- KEYS[9] metrics:failed            KEYS[10] sweeper:totals
-- KEYS[11] sweeper:holds            KEYS[12] sweeper:hold-tokens
-- ARGV[1] queue prefix 'emq:{q}:' (job rows and lane sets are derived from it,
--         so they hash to the same slot as KEYS)
-- ARGV[2] limit (jobs examined by this call; also leases held or settled)
-- ARGV[3] default budget (0 = never dead-letter)
-- ARGV[4] events channel
-- ARGV[5] hold lead (ms): leases due within it are held (lib/holds); 0 = none
-- ARGV[6] hold (ms): how long a held lease stays out of the reapers' sight
-- ARGV[7..] lane budget overrides as pairs: group, budget
--
-- Returns {recovered, dead_lettered, orphans, quarantined, more (0|1),
--          lanes, {problem, ...}, held, uncounted, next_at, now, took_us}
-- (lanes: one string, each lane's counts as '<#group>:<group><recovered>,<dead_lettered>;'
-- (#group in bytes): one reply item, where a triple per lane cost the caller's
-- parser more than the rest of the reply (20 lanes: 60 items);
-- problems: shared keys of the wrong type met after the moves; see guard;
-- held: leases this call took hold of; uncounted: holds a reaper ended before
-- the sweep could count the lapse; next_at: the server time (ms) of the next
-- lease to hold or count, -1 when none; now: this call's server time;
-- took_us: the server time this call took, in microseconds: the caller sizes
-- the next call by it; 0 on Valkey, whose TIME stands still within a script)

-- @include chunked
-- @include counters
-- @include death
-- @include guard
-- @include holds
-- @include lanes
-- @include refusals
-- @include listeners
-- @include text

-- the per-job commands go through locals: no lookup of `redis` and its field
-- each time (0.9 % of the instructions at 170 jobs a call)
local redis_call, redis_pcall = redis.call, redis.pcall
local prefix = ARGV[1]
local limit = tonumber(ARGV[2])
local default_budget = tonumber(ARGV[3])
local channel = ARGV[4]
local lead_ms = tonumber(ARGV[5])
local hold_ms = tonumber(ARGV[6])

local lane_budget = {}
for i = 7, #ARGV - 1, 2 do
  lane_budget[ARGV[i]] = tonumber(ARGV[i + 1])
end

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- Numbers go to Redis and into text as strings made by count_string or '%d':
-- a Lua number given to redis.call or joined with `..` is printed as a double
-- ('%.14g', '%.17g'), a slow printf (the lanes' reply text alone was 1 % of a
-- default call's instructions, bench/instructions.py).
local now_s = string.format('%d', now)

-- Holds first: a due hold's lease goes back to its deadline, so the walk
-- below counts it with the other lapses. A user who may not run the holds'
-- commands (ACL) still gets the sweep, and a problem that says so.
local holding = {active = KEYS[1], holds = KEYS[11], tokens = KEYS[12], prefix = prefix}
local hold_refusal = refused({{'ZADD', KEYS[11], '0', 'x'}, {'HSET', KEYS[12], 'x', '1'}, {'ZREM', KEYS[11], 'x'},
  {'HDEL', KEYS[12], 'x'}, {'ZADD', KEYS[1], 'XX', '0', 'x'}, {'ZCOUNT', KEYS[1], '0', '0'}})
local restored, uncounted, holds_left, held = 0, 0, false, 0

-- Nothing due, the usual pass of the lease-timed loop (an idle queue, healthy
-- leases): no hold whose deadline came (the first hold is ahead), nothing
-- expired and no lease to hold (the lowest score in `active` is past now +
-- lead). Two reads say so, where the walk below runs five commands for the
-- same empty answer (bench/stalls.py: 7 commands a pass become 4). The reply
-- is the walk's: next_at as next_event computes it. A read refused or a key of
-- the wrong type (pcall) leaves it to the walk, which names the problem; no
-- hold due spares the walk its settle read (one read more a call, not two).
local holds_due = true
if hold_refusal == nil then
  local first_hold = redis.pcall('ZRANGE', KEYS[11], '0', '0', 'WITHSCORES')
  if not first_hold.err then holds_due = #first_hold > 0 and tonumber(first_hold[2]) <= now end
  local first_lease = redis.pcall('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
  if not first_hold.err and not first_lease.err and not holds_due
      and (#first_lease == 0 or tonumber(first_lease[2]) > now + lead_ms) then
    local next_at = earliest_event(first_hold[2] or false, first_lease[2] or false, lead_ms)
    local t_end = redis.call('TIME')
    return {0, 0, 0, 0, 0, '', {}, 0, 0, next_at, now, (t_end[1] - t[1]) * 1000000 + (t_end[2] - t[2])}
  end
end

if hold_refusal == nil and holds_due then
  restored, uncounted, holds_left = settle_holds(holding, now, limit, hold_ms)
end

-- What every reply ends with: the holds taken now that the expired prefix is
-- drained (while work is left the caller calls again at once), and when to.
local function hold_reply(reply, more)
  if more == 0 and hold_refusal == nil and lead_ms > 0 then
    held = take_holds(holding, now, limit, lead_ms, hold_ms)
  end
  local next_at = now
  if more == 0 then next_at = next_event(holding, now, hold_refusal == nil and lead_ms or 0) end
  if hold_refusal ~= nil and lead_ms > 0 then
    reply[7][#reply[7] + 1] = 'the Redis user may not run ' .. hold_refusal .. ' (ACL): leases are not held, '
      .. "so EchoMQ's reapers may return lapsed jobs before the sweep counts them; grant it the queue's keys "
      .. 'and commands (e.g. ACL SETUSER <user> ~' .. prefix .. '* &' .. prefix .. 'events +@all)'
  end
  if uncounted > 0 then
    guarded(reply[7], {KEYS[10], 'hash'}, "this call's uncounted lapses were not counted", add_counts, KEYS[10],
      {'uncounted', uncounted})
  end
  local t_end = redis.call('TIME')
  reply[8], reply[9], reply[10], reply[11] = held, uncounted, next_at, now
  reply[12] = (t_end[1] - t[1]) * 1000000 + (t_end[2] - t[2])
  return reply
end

-- limit + 1 tells us exactly whether this call left expired work behind.
-- An `active` of the wrong type is named (Redis' own WRONGTYPE names no key);
-- any other error is raised as it is. Once per call: no cost per job.
local expired = redis.pcall('ZRANGEBYSCORE', KEYS[1], '-inf', now_s, 'LIMIT', '0', count_string(limit + 1))
if expired.err then
  read_refused(expired)
  require_sorted_set(KEYS[1], 'nothing was moved')
  error(expired)
end
local more = 0
if #expired > limit then
  more = 1
  expired[#expired] = nil
end
if holds_left then more = 1 end
if #expired == 0 then
  return hold_reply({0, 0, 0, 0, more, '', {}}, more)
end

-- pending and dead receive this call's jobs after their rows are written; an
-- error there would leave jobs in no set (an error does not undo a script's
-- writes), so a key of the wrong type refuses the call before any write.
require_sorted_set(KEYS[2], 'nothing was moved')
require_sorted_set(KEYS[3], 'nothing was moved')

-- Every command that runs once the batch has left `active`, on its real keys
-- (a row: the first of the batch); the lanes' and the totals' too: refused,
-- they would leave a lane slot taken for good.
local id1, row1 = expired[1], prefix .. 'job:' .. expired[1]
-- The batch leaves `active` by rank (below); by ZREM of each id for a user
-- granted ZREM only, command by command as docs/scripts.md listed them
-- before 4 December: the same ids leave either way.
local removal = {'ZREMRANGEBYRANK', KEYS[1], '0', '0'}
if refused({removal}) and not refused({{'ZREM', KEYS[1], id1}}) then removal = {'ZREM', KEYS[1], id1} end
require_permitted(prefix, {removal, {'ZADD', KEYS[2], '0', id1}, {'ZADD', KEYS[3], '0', id1},
  {'HMGET', row1, 'state'}, {'TYPE', row1}, {'EXISTS', row1}, {'HSET', row1, 'state', 'dead'},
  {'HINCRBY', row1, 'attempts', '1'}, {'HINCRBY', KEYS[5], 'g', '-1'}, {'HDEL', KEYS[5], 'g'},
  {'RPUSH', KEYS[4], 'g'}, {'LPUSH', KEYS[8], '1'}, {'LTRIM', KEYS[8], '0', '63'},
  {'HINCRBY', KEYS[9], 'count', '1'}, {'HINCRBY', KEYS[10], 'recovered', '1'}}, 'nothing was moved')
-- Events are fire-and-forget (the contract): without the channel the jobs
-- still move, and the call reports the events it could not send. Events no
-- one can receive now are not sent (lib/listeners): a PUBLISH a job.
local can_publish = refused({{'PUBLISH', channel, ''}}) == nil
local publishing = can_publish and listened(channel)
local unsent = 0
local function announce(event)
  if publishing then
    redis.call('PUBLISH', channel, event)
  elseif not can_publish then
    unsent = unsent + 1
  end
end

-- Ids almost never need escaping (text: json_escaped): one scan of the whole
-- batch decides, so the common case builds each event with one concatenation.
-- The scan passes only bytes json_escaped never changes, printable ASCII
-- (' '-'~') but '"' and '\': an anchored, repeated one-range class is matched
-- once over the batch (not tried again from every byte), and '"' and '\' are
-- plain finds. At batch 1,000 this is about 1,500 instructions per job, where
-- one unanchored search for '[%c"\\]' took 3,850 (8 % of the call). No
-- event to send, no scan.
local escape_ids = false
if publishing then
  local all_ids = table.concat(expired)
  escape_ids = string.find(all_ids, '^[ -~]*$') == nil or string.find(all_ids, '"', 1, true) ~= nil
    or string.find(all_ids, '\\', 1, true) ~= nil
end
local function json_id(id)
  if escape_ids then return json_escaped(id) end
  return id
end

local recovered, dead_lettered, orphans, quarantined = 0, 0, 0, 0
-- to_pending and each lane's jobs are ZADD's arguments as they are built:
-- '0', id, '0', id, ... (no second table copied from the first)
local to_pending, pending_n = {}, 0
local to_dead = {}
local lane_jobs = {}     -- group -> ZADD arguments of the ids recovered into the lane
local lane_freed = {}    -- group -> slots freed in gactive
local lane_rec = {}      -- group -> recovered count
local lane_dead = {}     -- group -> dead-lettered count
local touched = {}       -- groups in the order first seen (deterministic output)

local function touch(g)
  if lane_freed[g] == nil then
    lane_freed[g] = 0
    lane_rec[g] = 0
    lane_dead[g] = 0
    touched[#touched + 1] = g
  end
  lane_freed[g] = lane_freed[g] + 1
end

-- attempts: the row's attempts as a number when it is a counter, else its
-- raw value. Fenced whenever HINCRBY takes it: a counter, and also an integer
-- past our counter rule (negative, more than 15 digits), which a worker's
-- claim made its token all the same.
local function quarantine(id, row, g, problem, attempts)
  local reason = 'malformed: ' .. problem
  if row then
    local mark = attempts
    if type(attempts) == 'number' then
      mark = count_string(redis.call('HINCRBY', row, 'attempts', 1))
    elseif attempts and string.find(attempts, '^%-?[1-9]%d*$') then
      -- as Redis reads an integer; past int64, HINCRBY refuses it: left unfenced
      -- (no claim could have bumped it either). Read back: exact past 2^53.
      if type(redis.pcall('HINCRBY', row, 'attempts', 1)) == 'number' then
        mark = redis.call('HGET', row, 'attempts')
      end
    end
    redis.call('HSET', row, 'state', 'dead', 'last_error', reason, 'dead_at', now_s,
      'dead_attempts', death_mark(mark))
  end
  if g then touch(g) end
  to_dead[#to_dead + 1] = id
  quarantined = quarantined + 1
  announce('{"event":"failed","job":"' .. json_id(id) .. '","reason":"' .. json_escaped(reason) .. '"}')
end

-- A stray lease: the row says the job waits in pending (or its lane),
-- schedule or dead, and it does sit there. EchoMQ's lease extension re-adds an
-- id to active whenever the token matches (a stalled worker's late heartbeat
-- after a recovery does exactly that), so such an entry has no job in flight
-- behind it: counting a stall would move a waiting job a second time.
-- A set of the wrong type (pcall) holds nothing: the entry is then a stall.
-- A grouped job may wait in the flat pending too (the reference replay puts it
-- there), and a row whose group is empty names no lane.
local function listed(key, id)
  if key ~= KEYS[2] and key ~= KEYS[3] and not here(key) then return false end
  local score = redis.pcall('ZSCORE', key, id)
  if type(score) == 'table' and score.err then
    read_refused(score)
    return false
  end
  return score ~= false
end

local function waits_elsewhere(id, g, state)
  if state == 'pending' then
    if g and g ~= '' and listed(prefix .. 'g:' .. g .. ':pending', id) then return true end
    return listed(KEYS[2], id)
  elseif state == 'dead' then
    return listed(KEYS[3], id)
  elseif state == 'scheduled' then
    return listed(prefix .. 'schedule', id)
  end
  return false
end

-- The whole batch is read and decided before the first write. On a cluster
-- whose slot is being migrated, a key the call derives (a row, a lane,
-- schedule) may already have moved to the other node: Redis refuses the
-- command with an error, and an error after the batch left `active` would
-- leave its jobs in no set. Read first, such an error refuses the call with
-- nothing moved (the next pass tries again). Only a key of the wrong type is
-- an answer (read_refused).
local row_prefix = prefix .. 'job:'
-- The plan, by position in `expired` (parallel arrays: a table per job costs
-- more): what ('stall', 'orphan', 'quarantine', or 'unwritable' for a
-- quarantine with no row to write), its row key, its group (false: none),
-- stalled_or_problem (a stall's new stall count, a quarantine's problem) and
-- attempts_of (a stall's attempts; a quarantine's: a number when a counter,
-- fenced, else its raw value).
local what, rows, group_of, stalled_or_problem, attempts_of = {}, {}, {}, {}, {}
local lane_keys, probed = {}, {}  -- the lanes this call will write or ask for work
-- (numeric loops over the batch: ipairs costs a C call per job in Lua 5.1)
for i = 1, #expired do
  local id = expired[i]
  local row = row_prefix .. id
  rows[i] = row
  local f = redis_pcall('HMGET', row, 'group', 'stalled', 'attempts', 'state')
  if f.err then
    read_refused(f)
    if listed(KEYS[2], id) or listed(KEYS[3], id) or listed(prefix .. 'schedule', id) then
      -- a stray lease of an id that waits elsewhere (as above; its lane, if
      -- any, is unknown): sending it to the morgue would list it twice
      what[i], group_of[i] = 'orphan', false
    else
      -- Not a hash: nothing on it can be written. The id goes to the morgue
      -- as-is; morgue_list names the key type as the problem.
      what[i], group_of[i] = 'unwritable', false
      stalled_or_problem[i] = 'job row is a ' .. redis.call('TYPE', row).ok .. ', not a hash'
    end
  else
    local g, stalled_raw, attempts_raw, state = f[1], f[2], f[3], f[4]
    -- every claimed row has attempts, so EXISTS runs only for rare rows
    if g == false and stalled_raw == false and attempts_raw == false and not here(row) then
      -- completed (row deleted) while still listed in active: never recreate it
      what[i], group_of[i] = 'orphan', false
    elseif state and state ~= 'active' and waits_elsewhere(id, g, state) then
      what[i], group_of[i] = 'orphan', false -- a stray lease: drop the entry, touch nothing else
    else
      -- the usual counters (absent, one digit) by a lookup, without a call (below)
      local stalled = ONE_DIGIT[stalled_raw]
      if stalled == nil then stalled = count_of(stalled_raw) end
      local attempts = ONE_DIGIT[attempts_raw]
      if attempts == nil then attempts = count_of(attempts_raw) end
      if g == '' then
        what[i], group_of[i], attempts_of[i] = 'quarantine', false, attempts or attempts_raw
        stalled_or_problem[i] = 'group is empty'
      elseif stalled == nil then
        what[i], group_of[i], attempts_of[i] = 'quarantine', g, attempts or attempts_raw
        stalled_or_problem[i] = 'stalled is not a non-negative integer: ' .. excerpt(stalled_raw)
      elseif attempts == nil then
        -- a claim would fail on HINCRBY attempts; also unfenceable, hence no fence
        what[i], group_of[i], attempts_of[i] = 'quarantine', g, attempts_raw
        stalled_or_problem[i] = 'attempts is not a non-negative integer: ' .. excerpt(attempts_raw)
      else
        what[i], group_of[i], stalled_or_problem[i], attempts_of[i] = 'stall', g, stalled + 1, attempts
      end
      if g and g ~= '' and not probed[g] then
        probed[g] = true
        lane_keys[#lane_keys + 1] = prefix .. 'g:' .. g .. ':pending'
      end
    end
  end
end

-- A lane key that is absent here while its slot migrates refuses the call
-- now, as above (`active` makes the probe a multi-key one, see here()); only
-- that refusal matters, not the count.
variadic('EXISTS', KEYS[1], lane_keys, false)

-- The batch is the first #expired ranks of `active` (-inf is its lowest score,
-- and nothing above wrote to it): removed by rank, with no search per id and
-- none of the ids passed back to Redis (2 % of the call's instructions at
-- batch 1,000, bench/instructions.py).
if removal[1] == 'ZREM' then
  variadic('ZREM', KEYS[1], expired, false)
else
  redis.call('ZREMRANGEBYRANK', KEYS[1], '0', count_string(#expired - 1))
end

for i = 1, #expired do
  local id, step, g = expired[i], what[i], group_of[i] or nil
  if step ~= 'stall' then
    if step == 'orphan' then
      orphans = orphans + 1
    elseif step == 'unwritable' then
      quarantine(id, nil, nil, stalled_or_problem[i], nil)
    else
      quarantine(id, rows[i], g, stalled_or_problem[i], attempts_of[i])
    end
  else
    -- Nearly every job takes this path, so it calls none of the helpers
    -- (touch, count_string, announce, json_id): their lookups are written out,
    -- 4.8 % of the call's instructions at batch 1,000 (bench/instructions.py).
    local row, stalled, attempts = rows[i], stalled_or_problem[i], attempts_of[i]
    local budget = default_budget
    if g then
      local freed = lane_freed[g]
      if freed == nil then touch(g) else lane_freed[g] = freed + 1 end
      local override = lane_budget[g]
      if override ~= nil then budget = override end
    end
    -- attempts + 1 fences the stalled worker, whether the job dies or
    -- returns: its complete/retry/extend carry the old token and are
    -- refused with EMQSTALE (docs/scripts.md, "Fencing").
    local fence = DIGIT_OF[attempts + 1] or count_string(attempts + 1)
    if budget > 0 and stalled >= budget then
      -- dead_attempts: the attempts this dead_at belongs to (lib/death)
      redis.call('HSET', row, 'stalled', DIGIT_OF[stalled] or count_string(stalled), 'state', 'dead',
        'last_error', 'stalled', 'dead_at', now_s, 'attempts', fence, 'dead_attempts', fence)
      to_dead[#to_dead + 1] = id
      dead_lettered = dead_lettered + 1
      if g then lane_dead[g] = lane_dead[g] + 1 end
      if publishing then
        redis.call('PUBLISH', channel, '{"event":"failed","job":"' .. (escape_ids and json_escaped(id) or id)
          .. '","reason":"stalled"}')
      elseif not can_publish then
        unsent = unsent + 1
      end
    else
      redis_call('HSET', row, 'stalled', DIGIT_OF[stalled] or count_string(stalled), 'state', 'pending',
        'attempts', fence)
      if g then
        local jobs = lane_jobs[g]
        local n = lane_rec[g] * 2
        if jobs == nil then
          jobs = {}
          lane_jobs[g] = jobs
        end
        jobs[n + 1], jobs[n + 2] = '0', id
        lane_rec[g] = lane_rec[g] + 1
      else
        to_pending[pending_n + 1], to_pending[pending_n + 2] = '0', id
        pending_n = pending_n + 2
      end
      recovered = recovered + 1
      if publishing then
        redis_call('PUBLISH', channel, '{"event":"stalled","job":"' .. (escape_ids and json_escaped(id) or id) .. '"}')
      elseif not can_publish then
        unsent = unsent + 1
      end
    end
  end
end

if pending_n > 0 then variadic('ZADD', KEYS[2], to_pending, false) end
if #to_dead > 0 then variadic('ZADD', KEYS[3], to_dead, true) end

-- Lanes: their jobs back, then slots freed and the ring/wake rule, once per
-- lane after every ZADD of this call (so "the lane has work" sees them).
-- A lane key of the wrong type cannot take its jobs back: they go to the
-- morgue instead, quarantined with the reason (a `failed` event follows the
-- `stalled` one already sent).
-- (Their rows were fenced when they were recovered.)
local function lane_refused(g, lane, jobs, err)
  local kind = redis.call('TYPE', lane).ok
  local reason
  if kind == 'none' or kind == 'zset' then
    -- the right type, so the write itself was refused (ACL)
    reason = 'lane ' .. prefix .. 'g:' .. excerpt(g) .. ':pending refused the job: ' .. error_text(err)
  else
    reason = lane_type_problem(prefix, g, kind)
  end
  local ids = {}
  for i = 2, #jobs, 2 do
    local id = jobs[i]
    ids[#ids + 1] = id
    local row = row_prefix .. id
    -- attempts as the recovery fenced it in this call (rare: read back, not
    -- carried for every recovered job)
    local mark = death_mark(redis.call('HGET', row, 'attempts'))
    redis.call('HSET', row, 'state', 'dead', 'last_error', reason, 'dead_at', now_s, 'dead_attempts', mark)
    announce('{"event":"failed","job":"' .. json_id(id) .. '","reason":"' .. json_escaped(reason) .. '"}')
  end
  variadic('ZADD', KEYS[3], ids, true)
  recovered = recovered - #ids
  quarantined = quarantined + #ids
  lane_rec[g] = lane_rec[g] - #ids
  lane_jobs[g] = nil
end

local lanes_out = {}
for _, g in ipairs(touched) do
  local jobs = lane_jobs[g]
  if jobs then
    local lane = prefix .. 'g:' .. g .. ':pending'
    local ok, err = pcall(variadic, 'ZADD', lane, jobs, false)
    if not ok then lane_refused(g, lane, jobs, err) end
  end
  if lane_rec[g] > 0 or lane_dead[g] > 0 then
    lanes_out[#lanes_out + 1] = g
    lanes_out[#lanes_out + 1] = lane_rec[g]
    lanes_out[#lanes_out + 1] = lane_dead[g]
  end
end

-- Every job is in its set now: a shared key of the wrong type from here on is
-- reported in problems, never a reason to fail the call (guard).
local problems = {}
if unsent > 0 then
  -- the same words every call: the sweeper reports a problem when it appears
  problems[#problems + 1] = 'the Redis user may not PUBLISH to ' .. channel .. ' (ACL): the events of '
    .. 'recovered and dead-lettered jobs are not sent (the jobs move all the same); grant it &' .. channel
end
local unsettled = {}
guarded(problems, {KEYS[5], 'hash', KEYS[7], 'set', KEYS[6], 'hash', KEYS[4], 'list', KEYS[8], 'list'},
  "this call's lane slots, ring and wake were not (all) settled",
  settle_lanes, {prefix = prefix, ring = KEYS[4], paused = KEYS[7], glimit = KEYS[6],
    gactive = KEYS[5], wake = KEYS[8], unsettled = unsettled}, touched, lane_freed, lane_jobs)
unsettled_problems(problems, KEYS[5], unsettled)

local deaths = dead_lettered + quarantined
-- EchoMQ's counter: a corrupt one is left as it is, reported.
if deaths > 0 then
  local counted = redis.pcall('HINCRBY', KEYS[9], 'count', deaths)
  if type(counted) == 'table' and counted.err then
    problems[#problems + 1] = KEYS[9] .. " count was not incremented by this call's deaths ("
      .. counted.err .. '); repair or delete that key'
  end
end

local totals = {}
local function count(field, n)
  if n > 0 then
    totals[#totals + 1] = field
    totals[#totals + 1] = n
  end
end
count('recovered', recovered)
count('dead_lettered', dead_lettered)
count('orphans', orphans)
count('quarantined', quarantined)
for i = 1, #lanes_out, 3 do
  count('lane:' .. lanes_out[i] .. ':recovered', lanes_out[i + 1])
  count('lane:' .. lanes_out[i] .. ':dead_lettered', lanes_out[i + 2])
end
guarded(problems, {KEYS[10], 'hash'}, "this call's totals were not counted", add_counts, KEYS[10], totals)

local lanes_text = {}
for i = 1, #lanes_out, 3 do
  local g = lanes_out[i]
  lanes_text[#lanes_text + 1] = count_string(#g) .. ':' .. g .. count_string(lanes_out[i + 1]) .. ','
    .. count_string(lanes_out[i + 2]) .. ';'
end
return hold_reply({recovered, dead_lettered, orphans, quarantined, more, table.concat(lanes_text), problems}, more)
