-- counters: a row's counter (stalled, attempts) as Redis accepts it for
-- HINCRBY (no sign, no leading zero); more than 15 digits would lose
-- precision in Lua's doubles, so it is refused too. A missing field is 0;
-- an invalid one is nil.
local function count_of(value)
  if value == false then return 0 end
  if #value > 15 or not string.find(value, '^%d+$') then return nil end
  if #value > 1 and string.sub(value, 1, 1) == '0' then return nil end
  return tonumber(value)
end
