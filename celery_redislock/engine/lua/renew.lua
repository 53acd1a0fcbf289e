-- Extend one holder's leases in N leased semaphores (see admit.lua).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the holder's member
-- ARGV[2]   new lease length (ms), counted from now on the server's clock
--
-- Returns {lease_end_ms, lost}: lost counts the semaphores where the holder no longer had
-- a live lease (released, expired, or wiped by a flush or failover). A lease that ran out
-- is never revived, since another holder may have been admitted in its place; its entry
-- is removed.

local member = ARGV[1]
local lease = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + lease
local lost = 0

for i = 1, #KEYS do
  local key = KEYS[i]
  local current = redis.call('ZSCORE', key, member)
  if current and tonumber(current) > now then
    redis.call('ZADD', key, 'XX', lease_end, member)
    if redis.call('PTTL', key) < lease then
      redis.call('PEXPIRE', key, lease)  -- never shorter: PTTL was below the lease
    end
  else
    lost = lost + 1
    if current then redis.call('ZREM', key, member) end
  end
end
return {lease_end, lost}
