-- How many slots of a semaphore a plain acquire (Semaphore.acquire) could take now, on the
-- server's clock: none while it is paused; else the limit (the operator's override, else
-- the configured count) less the live leases and reservations. Reads only.
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the configured number of slots

local key = KEYS[1]
local now = server_now()
local slots, paused = semaphore_limit(key, tonumber(ARGV[1]), now)
if paused then return 0 end
local free = slots - redis.call('ZCOUNT', key, '(' .. now, '+inf')
if free < 0 then return 0 end
return free
