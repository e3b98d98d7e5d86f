-- guard: the steps a call takes after every one of its jobs is in its set
-- (the lanes' bookkeeping in gactive/ring/wake, our totals) write keys the
-- whole queue shares. Should one of them hold the wrong type, failing the
-- call then would lose its reply and not one job: the caller would retry an
-- interval later and recover one batch per interval. So such a step runs
-- guarded: when it fails and one of its keys has the wrong type, that key is
-- named in `problems` (returned to the caller, who reports it) and the call
-- goes on. So does a command the Redis user may not run (ACL; the scripts ask
-- before their first write, lib/refusals, but a user's rights can change and
-- Redis before 7 cannot be asked). Any other error (a bug) is raised.
--
--   guarded(problems, keys, consequence, step, ...)
--
-- keys         flat list: key, the type it should be ('hash', 'list', ...)
-- consequence  what was not done, for the report
-- Returns true when step(...) ran to the end.
--
--   error_text(err)   the message of an error pcall caught (a redis.call
--                     error is a table {err = message})

local A_TYPE = {hash = 'a hash', list = 'a list', set = 'a set', zset = 'a sorted set',
                string = 'a string', stream = 'a stream'}

local function error_text(err)
  if type(err) == 'table' and err.err then return err.err end
  return tostring(err)
end

local function guarded(problems, keys, consequence, step, ...)
  local ok, err = pcall(step, ...)
  if ok then return true end
  local named = false
  for i = 1, #keys, 2 do
    local key, want = keys[i], keys[i + 1]
    local kind = redis.call('TYPE', key).ok
    if kind ~= 'none' and kind ~= want then
      problems[#problems + 1] = key .. ' is ' .. (A_TYPE[kind] or kind) .. ', not ' .. A_TYPE[want]
        .. ': ' .. consequence .. '; repair or delete that key'
      named = true
    end
  end
  if not named then
    local text = error_text(err)
    -- an ACL refusal in Redis's words, or in Valkey's
    if not (text:find("executing the script can't", 1, true) or text:find('NOPERM', 1, true)
        or text:find('ACL failure in script', 1, true)) then
      error(err, 0) -- as raised: no second position prefix
    end
    problems[#problems + 1] = consequence .. ' (' .. text .. ')'
  end
  return false
end
