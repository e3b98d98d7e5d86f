-- ghost: the row EchoMQ's reference sweep recreates for a job that completed
-- while its id was still in `active` (the contract's known defects): it holds
-- only `stalled` and `state` (and `last_error` once that sweep dead-letters
-- it). Every job a worker claimed has `attempts`, every job enqueued a
-- `payload`: a row with neither is no job. Replayed, it would hand a worker a
-- completed job again, with no payload; the replay keeps it in `dead`, the
-- list names it, the purge removes it like any entry.
--
--   is_ghost(row)  for a hash row without `attempts`: whether it has no
--                  `payload` either (one HEXISTS, for such rows only)
--   GHOST_ROW      the reason (replay) and problem (list) given for one

local GHOST_ROW = "ghost row: no attempts and no payload (the row EchoMQ's reference sweep recreates "
  .. 'for a job that completed meanwhile): nothing to replay; purge it'

local function is_ghost(row)
  return redis.call('HEXISTS', row, 'payload') == 0
end
