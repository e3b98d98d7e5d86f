-- EchoMQ's reprocess of a dead job (its Jobs.reprocess, modelled from the
-- contract): out of `dead`, `last_error` deleted, `state = pending`, into the
-- flat `pending` even for a grouped job (the reference's known defect: no
-- lane, no ring, no wake). Every other field is kept: `attempts` (the token),
-- `stalled`, and our `dead_at` / `dead_attempts`.
-- KEYS: 1 row, 2 dead, 3 pending
-- ARGV: 1 id
-- Returns 1 reprocessed, -1 row gone, or the error EMQSTATE (not in dead).
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('ZREM', KEYS[2], ARGV[1]) ~= 1 then
  return redis.error_reply('EMQSTATE not dead')
end
redis.call('HDEL', KEYS[1], 'last_error')
redis.call('HSET', KEYS[1], 'state', 'pending')
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return 1
