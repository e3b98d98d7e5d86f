-- leave_place: a finished claim (EchoMQ's complete or retry) leaves its place.
-- Still in active: the lane slot is freed, and the lane goes back on ring (with
-- a wake) when it has work, is not paused and is under its limit. No longer in
-- active (recovered by a sweep, not yet re-claimed): the id is taken out of its
-- pending set, and an emptied lane off the ring.
local function leave_place(id, g, was_active, lane, pending, ring, gactive, glimit, paused, wake)
  if g then
    if was_active == 1 then
      local act = redis.call('HINCRBY', gactive, g, -1)
      if act <= 0 then redis.call('HDEL', gactive, g) end
      if redis.call('SISMEMBER', paused, g) == 0 and redis.call('ZCARD', lane) > 0 then
        local lim = redis.call('HGET', glimit, g)
        if (not lim or act < tonumber(lim)) and not redis.call('LPOS', ring, g) then
          redis.call('RPUSH', ring, g)
          redis.call('LPUSH', wake, '1')
          redis.call('LTRIM', wake, 0, 63)
        end
      end
    else
      redis.call('ZREM', lane, id)
      if redis.call('ZCARD', lane) == 0 then redis.call('LREM', ring, 0, g) end
    end
  elseif was_active == 0 then
    redis.call('ZREM', pending, id)
  end
end
