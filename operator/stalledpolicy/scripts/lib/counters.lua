-- counters: a row's counter (stalled, attempts) as Redis accepts it for
-- HINCRBY (no sign, no leading zero); more than 15 digits would lose
-- precision in Lua's doubles, so it is refused too. A missing field is 0;
-- an invalid one is nil.
-- Almost every counter is one digit: a table lookup answers those without
-- the pattern match (3.6 % of the sweep's instructions at batch 1,000).
-- (false: a missing field, as HMGET gives it; callers may look up first)
local ONE_DIGIT = {['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4,
                   ['5'] = 5, ['6'] = 6, ['7'] = 7, ['8'] = 8, ['9'] = 9, [false] = 0}

-- and the other way: a count as the integer string HINCRBY writes
local DIGIT_OF = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}

-- the first count of 16 digits: a counter is below it
local COUNTER_LIMIT = 1e15

local function count_string(n)
  return DIGIT_OF[n] or string.format('%d', n)
end

local function count_of(value)
  if value == false then return 0 end
  local digit = ONE_DIGIT[value]
  if digit then return digit end
  -- ('0' is a digit above: a longer count has no leading zero)
  if #value > 15 or not string.find(value, '^[1-9]%d*$') then return nil end
  return tonumber(value)
end

-- add_counts: several counters of one hash raised, one HINCRBY each
-- (docs/architecture.md, "Numbers counted by Redis"); deltas is a flat list
-- field, n, field, n, ... (n > 0). A field that is not a counter by the rule
-- above (nothing but our scripts writes this hash) starts again from n:
-- HINCRBY refuses what is not an integer or has a leading zero, and what it
-- accepts beyond the rule (a minus, more than 15 digits) shows in its result.
local function add_counts(key, deltas)
  for i = 1, #deltas, 2 do
    local field, n = deltas[i], deltas[i + 1]
    local by = count_string(n)
    local raised = redis.pcall('HINCRBY', key, field, by)
    if type(raised) ~= 'number' or raised < n or raised - n >= COUNTER_LIMIT then
      -- an error is raised again here if it was not the field's (a key of
      -- the wrong type, a refusal): the caller's guard names it
      redis.call('HSET', key, field, by)
    end
  end
end
