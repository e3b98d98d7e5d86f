-- elsewhere: ids of `dead` that also wait where a worker claims them (the
-- flat pending, their lane, schedule). No EchoMQ transition leaves a job so;
-- a tool or a hand that copied an id does. Purged, the row would go and a
-- worker would claim the id with no payload (the claim recreates a ghost
-- row); replayed, the job would wait twice and run twice. The morgue scripts
-- keep such an id in `dead` and say where it waits. Uses refusals (include it
-- before elsewhere): KEYS[1] must be `dead`.
--
--   waiting_elsewhere(prefix, ids, groups)
--       ids: a list; groups: each id's group by position (false: a flat job)
--       returns id -> the first key found holding it (one ZMSCORE per key and
--       4,000 ids: the flat pending, each lane, schedule)

local function probe_waiting(found, key, ids)
  -- an absent key holds nothing, and asked with `dead` it is no slot migrating
  -- away (refusals, here); a key of another type holds no job either
  if #ids == 0 or not here(key) then return end
  for i = 1, #ids, 4000 do
    local last = math.min(i + 3999, #ids)
    local scores = redis.pcall('ZMSCORE', key, unpack(ids, i, last))
    if scores.err then
      read_refused(scores)
      return
    end
    for j = i, last do
      if scores[j - i + 1] and found[ids[j]] == nil then found[ids[j]] = key end
    end
  end
end

local function waiting_elsewhere(prefix, ids, groups)
  local found = {}
  if #ids == 0 then return found end
  local by_lane, lane_order = {}, {}
  for i = 1, #ids do
    local g = groups[i]
    if g and g ~= '' then
      if by_lane[g] == nil then
        by_lane[g] = {}
        lane_order[#lane_order + 1] = g
      end
      local members = by_lane[g]
      members[#members + 1] = ids[i]
    end
  end
  probe_waiting(found, prefix .. 'pending', ids)
  for _, g in ipairs(lane_order) do
    probe_waiting(found, prefix .. 'g:' .. g .. ':pending', by_lane[g])
  end
  probe_waiting(found, prefix .. 'schedule', ids)
  return found
end
