-- death: a dead job's time of death, the one rule the sweep, the purge and
-- the scan share (uses counters: include it first).
--
-- Whatever writes `dead_at` (server ms) also writes `dead_attempts`: the
-- row's `attempts` field as it is at that moment, its bytes as they are (a
-- valid counter or not), '' when the row has none (death_mark). Every claim
-- changes `attempts` (the contract: +1, the fencing token). So a `dead_at`
-- counts only while `dead_attempts` equals the row's `attempts` (both read
-- the same way, absent as ''): else the job was claimed again since (EchoMQ's
-- own reprocess keeps `dead_at`, and its retry writes none when the job dies
-- again), and that `dead_at` is an earlier death, not this one.
--
--   death_mark(attempts)
--       the value of `dead_attempts` next to a `dead_at` written now, from
--       the row's `attempts` as HMGET/HGET read it (false when absent)
--   time_of_death(dead_at, mark, attempts, now)
--       the time of death in ms, or nil (undated) when: `dead_at` is absent or
--       not a counter (lib/counters: digits only, no sign, no leading zero, at
--       most 15 digits); `dead_attempts` is absent (written before the mark
--       existed: the purge dates such an entry again, so it is purged later,
--       never earlier) or differs from `attempts`; or `dead_at` is later than
--       now (a clock stepped back, a failover to a server that is behind, a
--       bad write: the job died by now at the latest, and a far future value
--       would outlive every age purge)
local function death_mark(attempts)
  return attempts or ''
end

local function time_of_death(dead_at, mark, attempts, now)
  if dead_at == false or mark ~= (attempts or '') then return nil end
  local died = count_of(dead_at)
  if died == nil or died > now then return nil end
  return died
end
