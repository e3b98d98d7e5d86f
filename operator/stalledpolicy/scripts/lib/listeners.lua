-- listeners: whether a message published on a channel now could reach anyone
-- (docs/architecture.md, "Events nobody can receive"). PUBLISH reaches this
-- server's subscribers of the channel or of any pattern; in a cluster, every
-- node's (the cluster bus carries it); outside one, every replica's: Redis
-- feeds it to the replication stream, which exists while the server has a
-- replication backlog (created for the first replica, kept for one that
-- resumes). With none of these, PUBLISH does nothing and still costs a command
-- a job: the sweep then leaves its events unsent. What cannot be asked (ACL,
-- an INFO without the field) counts as a listener. Uses refusals (include it
-- first).
--
--   listened(channel) -> false when no one can receive a message on channel now

local function info_has(section, line)
  local text = redis.pcall('INFO', section)
  return type(text) == 'string' and string.find(text, '\r\n' .. line .. '\r\n', 1, true) ~= nil
end

local function listened(channel)
  if refused({{'PUBSUB', 'NUMSUB', channel}, {'PUBSUB', 'NUMPAT'}, {'INFO', 'replication'}}) then return true end
  local subscribers = redis.pcall('PUBSUB', 'NUMSUB', channel)
  if subscribers.err or subscribers[2] ~= 0 or redis.pcall('PUBSUB', 'NUMPAT') ~= 0 then return true end
  return not (info_has('cluster', 'cluster_enabled:0') and info_has('replication', 'repl_backlog_active:0'))
end
