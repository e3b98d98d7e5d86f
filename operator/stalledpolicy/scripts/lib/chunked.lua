-- chunked: unpack() is bounded by the Lua C stack (8000 slots), so variadic
-- commands go in chunks of at most 4000 arguments. with_zero_score puts a 0
-- before each member (ZADD into a set whose scores are all 0), as the string
-- '0': Redis would format a Lua number as a double.
local function variadic(cmd, key, members, with_zero_score)
  local chunk = with_zero_score and 2000 or 4000
  local n = #members
  local i = 1
  while i <= n do
    local last = math.min(i + chunk - 1, n)
    if with_zero_score then
      local args, k = {}, 0
      for j = i, last do
        args[k + 1] = '0'
        args[k + 2] = members[j]
        k = k + 2
      end
      redis.call(cmd, key, unpack(args, 1, k))
    else
      redis.call(cmd, key, unpack(members, i, last))
    end
    i = last + 1
  end
end

-- collect: a variadic read (HMGET, SMISMEMBER) in the same chunks; the
-- replies joined, one per member, in order (one chunk: its reply as it is).
local function collect(cmd, key, members)
  local n = #members
  if n <= 4000 then return redis.call(cmd, key, unpack(members, 1, n)) end
  local out = {}
  local i = 1
  while i <= n do
    local last = math.min(i + 3999, n)
    local reply = redis.call(cmd, key, unpack(members, i, last))
    for j = 1, #reply do out[#out + 1] = reply[j] end
    i = last + 1
  end
  return out
end
