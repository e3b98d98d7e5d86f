-- morgue_window: the ids a morgue script examines in one call, and where the
-- next call resumes ('' = the end of `dead`). mode 'ids': ARGV[first_id..]
-- as given (the caller checks each is in `dead`); mode 'scan': `dead` in id
-- order (all scores are 0), up to window ids after cursor ('' = the start).
--
-- A `dead` of the wrong type stops the call before any write, with an error
-- that names the key (the scripts' own EMQWRONGTYPE, not Redis' WRONGTYPE
-- from inside the script).
local function check_dead_key(dead_key)
  local kind = redis.call('TYPE', dead_key).ok
  if kind ~= 'none' and kind ~= 'zset' then
    error(redis.error_reply('EMQWRONGTYPE ' .. dead_key .. ' is a ' .. kind .. ', not a sorted set: '
      .. 'nothing was read or changed; repair or delete that key (EchoMQ cannot use it either)'))
  end
end

local function morgue_window(dead_key, mode, cursor, window, first_id)
  check_dead_key(dead_key)
  if mode == 'ids' then
    local ids = {}
    for i = first_id, #ARGV do ids[#ids + 1] = ARGV[i] end
    return ids, ''
  end
  local min = '-'
  if cursor ~= '' then min = '(' .. cursor end
  local ids = redis.call('ZRANGEBYLEX', dead_key, min, '+', 'LIMIT', 0, window)
  if #ids == window then return ids, ids[#ids] end
  return ids, ''
end
