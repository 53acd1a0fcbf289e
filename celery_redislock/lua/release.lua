-- Give back the slots of one holder in N leased semaphores (see admit.lua).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the holder's member, "token acquired_ms fence description"
-- ARGV[2]   how long it held the slots (ms), for the average hold time
--
-- Returns how many of the N semaphores the holder was removed from: 0 when it held none
-- (already released, or its lease ran out), so releasing twice is harmless and a holder
-- never frees a slot another holder has. The average hold time is kept only for
-- semaphores that have refused a run (waiters use it); the key's own expiry, set by
-- admit.lua, removes what is left of an idle semaphore.

local member = ARGV[1]
local held = tonumber(ARGV[2])
local released = 0

for i = 1, #KEYS do
  local key = KEYS[i]
  if redis.call('ZREM', key, member) == 1 then
    released = released + 1
    local average = redis.call('ZSCORE', key, '#hold')
    if average then
      average = -tonumber(average) - 1
      if average >= 0 then held = average * 0.8 + held * 0.2 end
      redis.call('ZADD', key, -1 - math.floor(held), '#hold')
    end
  end
end
return released
