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

local function count_string(n)
  return DIGIT_OF[n] or string.format('%d', n)
end

local function count_of(value)
  if value == false then return 0 end
  local digit = ONE_DIGIT[value]
  if digit then return digit end
  if #value > 15 or not string.find(value, '^%d+$') then return nil end
  if #value > 1 and string.sub(value, 1, 1) == '0' then return nil end
  return tonumber(value)
end

-- add_counts (uses chunked: include it first): several HINCRBYs on one
-- hash in two commands (HMGET, HSET);
-- deltas is a flat list field, n, field, n, ... A field that is not a
-- counter (nothing but our scripts writes this hash) starts again from n.
local function add_counts(key, deltas)
  if #deltas == 0 then return end
  local fields = {}
  for i = 1, #deltas, 2 do fields[#fields + 1] = deltas[i] end
  local current = collect('HMGET', key, fields)
  local writes = {}
  for i = 1, #deltas, 2 do
    local was = count_of(current[(i + 1) / 2]) or 0
    writes[#writes + 1] = deltas[i]
    writes[#writes + 1] = string.format('%d', was + deltas[i + 1])
  end
  variadic('HSET', key, writes, false)
end
