-- How many live leases a semaphore has now (see admit.lua), on the server's clock.
--
-- KEYS[1]   the semaphore

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
