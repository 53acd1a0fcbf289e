-- Extend one holder's leases in N leased semaphores (see admit.lua).
--
-- KEYS[2i-1], KEYS[2i]  holders and details of semaphore i
-- ARGV[1]               holder token
-- ARGV[2]               new lease length (ms), counted from now on the server's clock
--
-- Returns {lease_end_ms, lost}: lost counts the semaphores where the token no longer held
-- a live lease (released, expired, or wiped by a flush or failover). A lease that ran out
-- is never revived, since another holder may have been admitted in its place; its entry
-- is removed so the slot is free for the next acquire.

local token = ARGV[1]
local lease = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + lease
local lost = 0

for i = 1, #KEYS / 2 do
  local holders, details = KEYS[2 * i - 1], KEYS[2 * i]
  local current = redis.call('ZSCORE', holders, token)
  if current and tonumber(current) > now then
    redis.call('ZADD', holders, 'XX', lease_end, token)
    if redis.call('PTTL', holders) < lease then
      redis.call('PEXPIRE', holders, lease)
      redis.call('PEXPIRE', details, lease)
    end
  else
    lost = lost + 1
    if current then
      redis.call('ZREM', holders, token)
      redis.call('HDEL', details, token)
    end
  end
end
return {lease_end, lost}
