-- refusals: why a script stops before its first write. Nothing undoes a
-- script's writes, so a command refused half-way would leave jobs out of one
-- set and in no other: a script asks first, and refuses the whole call with an
-- error that names the key and says what was not done.
--
--   require_sorted_set(key, consequence)
--       raises EMQWRONGTYPE unless key is a sorted set or absent
--   refused(checks)
--       the first of checks (each {command, key, args...}, args as the real
--       call gives them) the Redis user may not run (ACL), as 'COMMAND key', or
--       nil. Redis 7's default `acl-pubsub-default resetchannels` gives a new
--       user no channel at all. redis.acl_check_cmd exists from Redis 7.0;
--       before, there is no way to ask, and a refusal raises as any error does.
--   require_permitted(prefix, checks, consequence)
--       raises EMQNOPERM naming the first refused check (prefix: the queue's
--       'emq:{q}:', for the grant it suggests)
--   here(key)
--       whether key exists, asked together with KEYS[1] (which must exist: the
--       set the call read its ids from). A key that is absent may only have
--       moved: while the slot migrates, Redis answers a command naming it
--       alone as absent on the importing node (the caller came with ASKING);
--       named with a second key, it refuses it there (TRYAGAIN; Valkey 8:
--       'undeclared keys were accessed during rehashing of the slot'), as on
--       the migrating node. So absent means absent, and the call stops otherwise.
--   read_refused(reply)
--       for the error reply of a read made with redis.pcall: returns when the
--       key holds another type (an answer the caller reads as such); raises any
--       other error as it is. A script reads before its first write, so the
--       call then stops with nothing changed: on a cluster whose slot is being
--       migrated, a key already moved to the other node is refused with
--       'Script attempted to access a non local key' (the next call, once the
--       slot has moved, goes to that node), and a read the ACL refuses is no
--       answer either.

local function require_sorted_set(key, consequence)
  local kind = redis.call('TYPE', key).ok
  if kind ~= 'none' and kind ~= 'zset' then
    error(redis.error_reply('EMQWRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a sorted set: '
      .. consequence .. '; repair or delete that key (EchoMQ cannot use it either)'))
  end
end

local function refused(checks)
  if redis.acl_check_cmd == nil then return nil end
  for _, check in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(check)) then
      return check[1] .. ' ' .. check[2]
    end
  end
  return nil
end

local function require_permitted(prefix, checks, consequence)
  local what = refused(checks)
  if what then
    error(redis.error_reply('EMQNOPERM the Redis user may not run ' .. what .. ' (ACL): ' .. consequence
      .. "; grant it the queue's keys, channel and commands (e.g. ACL SETUSER <user> ~" .. prefix .. '* &'
      .. prefix .. 'events +@all)'))
  end
end

local function read_refused(reply)
  if string.sub(reply.err, 1, 10) ~= 'WRONGTYPE ' then error(reply) end
end

local function here(key)
  return redis.call('EXISTS', key, KEYS[1]) == 2
end
