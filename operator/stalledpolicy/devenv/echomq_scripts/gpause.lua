-- Pause a lane: off the ring; its backlog and in-flight work are untouched.
-- KEYS: 1 paused, 2 ring
-- ARGV: 1 group
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 1
