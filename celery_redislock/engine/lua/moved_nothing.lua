-- A move out of a semaphore's parking queue found it empty (the parked copy not yet
-- published, or the anonymous entries counted too many): the anonymous entries are
-- dropped and the reservation the move was for is given back at once, not left to
-- lapse. A move owed from a fair line's sub-line gives that sub-line back its count
-- and turn (fair.lua), so the poll owes it again from the same queue. (fair.lua and
-- parking.lua are put in front of this script.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the sub-line the move was owed from ('' or missing: the line's own queue)
--
-- Returns 1 if a reservation was given back, else 0.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key = KEYS[1]
fair_unmove(key, ARGV[1] or '')
if redis.call('HEXISTS', parked_key(key, 'pn'), 'a') == 1 then
  redis.call('HSET', parked_key(key, 'pn'), 'a', 0)
end
if take_reservation(key, now) then return 1 end
return 0
