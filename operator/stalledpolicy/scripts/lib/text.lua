-- text: what a script composes from a queue's bytes (ids, field values, group
-- names) is valid UTF-8, so every reader can decode it strictly (the JSON
-- events on emq:{q}:events, the last_error a quarantine writes, the replay's
-- reasons). A valid multi-byte character passes as it is; each byte that
-- begins no valid UTF-8 sequence (a stray continuation byte, a lead byte cut
-- short, an overlong form, a UTF-16 surrogate, a code point above U+10FFFF,
-- 0xC0, 0xC1, 0xF5-0xFF) becomes one U+FFFD, the same rule as Python's strict
-- decoder for what is valid.
--
--   utf8_clean(s, replacement)  s with each such byte replaced
--   readable(s)                 s cleaned with U+FFFD itself (for stored text)
--   excerpt(value)              a bad value quoted in a reason: readable, and
--                               cut after at most 64 bytes (then '...') on a
--                               character boundary
--   json_escaped(s)             the inside of a JSON string literal holding s:
--                               '"', '\', control bytes escaped, U+FFFD written
--                               as \ufffd
--   lane_type_problem(prefix, g, kind)
--                               the reason given for a lane key of the wrong
--                               type (sweep and replay both refuse such a lane)
--   unsettled_problems(problems, gactive, unsettled)
--                               a problem added for each lane settle_lanes
--                               (lib/lanes) left off the ring: its gactive
--                               value is not a count, or its glimit value
--                               not a number

-- Nothing is built when the library loads (it loads on every call of a
-- script): the rules are comparisons, not tables.

-- the bytes that follow lead byte c, and the range of the first of them (the
-- others are 0x80-0xBF); 0 when c leads nothing
local function utf8_lead(c)
  if c < 0xC2 then return 0 end
  if c <= 0xDF then return 1, 0x80, 0xBF end
  if c == 0xE0 then return 2, 0xA0, 0xBF end  -- no overlong form
  if c == 0xED then return 2, 0x80, 0x9F end  -- no UTF-16 surrogate
  if c <= 0xEF then return 2, 0x80, 0xBF end
  if c == 0xF0 then return 3, 0x90, 0xBF end  -- no overlong form
  if c <= 0xF3 then return 3, 0x80, 0xBF end
  if c == 0xF4 then return 3, 0x80, 0x8F end  -- nothing above U+10FFFF
  return 0
end

local function utf8_clean(s, replacement)
  if not string.find(s, '[\128-\255]') then return s end
  local out, n = {}, 0
  local i, len, run = 1, #s, 1      -- run: where the bytes still to copy start
  while i <= len do
    local c = string.byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      local size, lo, hi = utf8_lead(c)
      if size > 0 then
        local d = string.byte(s, i + 1)
        if d == nil or d < lo or d > hi then
          size = 0
        else
          for j = 2, size do
            d = string.byte(s, i + j)
            if d == nil or d < 0x80 or d > 0xBF then
              size = 0
              break
            end
          end
        end
      end
      if size > 0 then
        i = i + size + 1
      else
        n = n + 1
        out[n] = string.sub(s, run, i - 1)
        n = n + 1
        out[n] = replacement
        i = i + 1
        run = i
      end
    end
  end
  if n == 0 then return s end
  n = n + 1
  out[n] = string.sub(s, run)
  return table.concat(out, '', 1, n)
end

local REPLACEMENT_CHARACTER = '\239\191\189' -- U+FFFD in UTF-8

local function readable(s)
  return utf8_clean(s, REPLACEMENT_CHARACTER)
end

local EXCERPT_BYTES = 64

local function excerpt(value)
  if #value <= EXCERPT_BYTES then return readable(value) end
  -- never end inside a character: back up over the continuation bytes
  -- (0x80-0xBF) of one that crosses the cut (at most 3 of them)
  local cut = EXCERPT_BYTES
  while cut > EXCERPT_BYTES - 3 do
    local b = string.byte(value, cut + 1)
    if b < 0x80 or b > 0xBF then break end
    cut = cut - 1
  end
  return readable(string.sub(value, 1, cut)) .. '...'
end

local function json_escape_byte(c)
  if c == '"' then return '\\"' end
  if c == '\\' then return '\\\\' end
  return string.format('\\u%04x', string.byte(c))
end

local function json_escaped(s)
  return utf8_clean((string.gsub(s, '[%c"\\]', json_escape_byte)), '\\ufffd')
end

local function lane_type_problem(prefix, g, kind)
  -- the group quoted as an excerpt, like any value a reason quotes
  return 'malformed: lane ' .. prefix .. 'g:' .. excerpt(g) .. ':pending is a ' .. kind .. ', not a sorted set'
end

local function unsettled_problems(problems, gactive, unsettled)
  for i = 1, #unsettled, 3 do
    local key, g, value = unsettled[i], excerpt(unsettled[i + 1]), excerpt(unsettled[i + 2])
    local what, fix = 'a count', "set it to the number of the lane's jobs in flight"
    if key ~= gactive then
      what, fix = 'a number', "set it to the lane's limit, or delete the field for no limit"
    end
    problems[#problems + 1] = key .. ' field ' .. g .. ' is not ' .. what .. ' (' .. value
      .. "): left as it is, and lane " .. g .. " not put back on the ring (EchoMQ's claim of a lane job "
      .. 'fails half-way on it); ' .. fix
  end
end
