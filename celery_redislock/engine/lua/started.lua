-- The body of a run admitted off a parked line started and its message was acknowledged
-- (default acks), or it ended: the reference its holder claimed in each semaphore
-- becomes served, and is kept so that any copy of the run that comes back ends unrun.
-- (parking.lua is put in front of this script.)
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the holder token
--
-- Returns how many references became served.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local served = 0
for i = 1, #KEYS do served = served + serve_claim(KEYS[i], ARGV[1], now) end
return served
