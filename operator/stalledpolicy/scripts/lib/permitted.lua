-- permitted: the Redis user a script runs as may be refused a command, a key
-- or a channel (ACL; Redis 7's default `acl-pubsub-default resetchannels`
-- gives a new user no channel at all). A command refused after the script's
-- first write stops the script there, and nothing undoes what it wrote: jobs
-- out of one set and in no other. So a script asks, before its first write,
-- for every command it will write with, on the keys it will write.
--
--   refused(checks)       the first of checks (each {command, key, args...},
--                         args as the real call gives them) the user may not
--                         run, as 'COMMAND key', or nil
--   no_permission(prefix, what, consequence)
--                         the error reply that names it (prefix: the queue's
--                         'emq:{q}:', for the grant it suggests)
--
-- redis.acl_check_cmd exists from Redis 7.0; before, there is no way to ask,
-- and a refusal raises as any error does.

local function refused(checks)
  if redis.acl_check_cmd == nil then return nil end
  for _, check in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(check)) then
      return check[1] .. ' ' .. check[2]
    end
  end
  return nil
end

local function no_permission(prefix, what, consequence)
  return redis.error_reply('EMQNOPERM the Redis user may not run ' .. what .. ' (ACL): ' .. consequence
    .. "; grant it the queue's keys, channel and commands (e.g. ACL SETUSER <user> ~" .. prefix .. '* &'
    .. prefix .. 'events +@all)')
end
