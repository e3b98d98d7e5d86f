-- morgue_window: the ids a morgue script examines in one call, and where the
-- next call resumes ('' = the end of `dead`). mode 'ids': ARGV[first_id..]
-- as given, each once (an id given twice would be counted twice; the caller
-- checks each is in `dead`); mode 'scan': `dead` in id order (all scores are
-- 0), up to window ids after cursor ('' = the start).
--
-- A `dead` of the wrong type stops the call before anything is read or
-- written (lib/refusals; include it before this library).
local function morgue_window(dead_key, mode, cursor, window, first_id)
  require_sorted_set(dead_key, 'nothing was read or changed')
  if mode == 'ids' then
    local ids, seen = {}, {}
    for i = first_id, #ARGV do
      local id = ARGV[i]
      if not seen[id] then
        seen[id] = true
        ids[#ids + 1] = id
      end
    end
    return ids, ''
  end
  local min = '-'
  if cursor ~= '' then min = '(' .. cursor end
  local ids = redis.call('ZRANGEBYLEX', dead_key, min, '+', 'LIMIT', 0, window)
  if #ids == window then return ids, ids[#ids] end
  return ids, ''
end
