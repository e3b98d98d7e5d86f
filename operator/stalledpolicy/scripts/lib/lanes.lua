-- lanes: the ring/wake rule (docs/scripts.md, "The ring/wake rule") for every
-- script that gives a lane work or frees one of its slots.
--
--   local ring = lane_ring(ring_key, paused_key, glimit_key, gactive_key, wake_key)
--   ring.offer(g, lane_pending, active)  -- once per lane, after the call's moves
--   ring.finish()                        -- once, after every offer
--
-- offer puts lane g back on ring and pushes one wake when the lane has work,
-- is not paused, is under its glimit and is not on ring yet. lane_pending is
-- the lane's pending key to check for work, or nil when the caller has just
-- added work to it; active is the lane's gactive count, or nil to read it
-- here (a missing or non-numeric field counts as 0). Each check is one
-- command, made only when the cheaper ones before it pass.
local function lane_ring(ring_key, paused_key, glimit_key, gactive_key, wake_key)
  local woke = false
  local ring = {}
  function ring.offer(g, lane_pending, active)
    if redis.call('SISMEMBER', paused_key, g) == 1 then return end
    if lane_pending and redis.call('ZCARD', lane_pending) == 0 then return end
    if active == nil then active = tonumber(redis.call('HGET', gactive_key, g) or '0') or 0 end
    -- a limit that is not a number is no limit
    local cap = tonumber(redis.call('HGET', glimit_key, g) or '')
    if (cap == nil or active < cap) and not redis.call('LPOS', ring_key, g) then
      redis.call('RPUSH', ring_key, g)
      redis.call('LPUSH', wake_key, '1')
      woke = true
    end
  end
  function ring.finish()
    if woke then redis.call('LTRIM', wake_key, 0, 63) end
  end
  return ring
end
