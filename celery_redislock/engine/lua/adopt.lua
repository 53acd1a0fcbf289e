-- A process takes over a holder admitted by another one (a worker's main process admits,
-- the pool process that runs the task adopts): in N leased semaphores, the holder's
-- member is replaced by one with the adopter's description, and its lease renewed
-- (with its units: units.lua is put in front of this script).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the member written at admission
-- ARGV[2]   the adopter's member (same token, time and fence; its own description)
-- ARGV[3]   lease length (ms), counted from now on the server's clock
-- ARGV[3+i] the holder's cost in semaphore i, if above 1; missing: 1
--
-- Returns the new end of the lease (ms), or 0 when the holder had no live lease left in
-- one of the semaphores (then nothing is changed: the adopter must not run on it).

local old, new = ARGV[1], ARGV[2]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + tonumber(ARGV[3])

for i = 1, #KEYS do
  local current = redis.call('ZSCORE', KEYS[i], old)
  if not (current and tonumber(current) > now) then return 0 end
end
for i = 1, #KEYS do
  redis.call('ZREM', KEYS[i], old)
  redis.call('ZADD', KEYS[i], lease_end, new)
  add_units(KEYS[i], token_of(old), cost_of(3, i), lease_end, 'XX')
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[3]) then
    -- recorded as admit.lua reads it (line.lua's '#ttl')
    redis.call('ZADD', KEYS[i], string.format('%d', 1000 - lease_end), '#ttl')
    redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[3]))
  end
end
return lease_end
