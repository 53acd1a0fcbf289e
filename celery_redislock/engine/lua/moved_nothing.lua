-- A move out of a semaphore's parking queue found it empty (the parked copy not yet
-- published, the anonymous entries counted too many, or a fair sub-line counted waiting
-- with nothing parked): the anonymous entries are dropped and the reservation the move
-- was for is given back at once, not left to lapse. A move owed from a fair line's
-- sub-line counts its copy again at the sub-line's own turn within the publish grace of
-- its first empty move, and past it drops that count (fair.lua's fair_unmove): a
-- sub-line with nothing parked is never put first again. (fair.lua and parking.lua are
-- put in front of this script.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the sub-line the move was owed from ('' or missing: the line's own queue)
-- ARGV[2]   the publish grace (ms; missing: 2000)
-- ARGV[3]   '0': no slot was reserved for the move (a standby's): none is given back
--
-- Returns 1 if a reservation was given back, else 0.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key = KEYS[1]
fair_unmove(key, ARGV[1] or '', now, tonumber(ARGV[2] or '') or 2000)
if redis.call('HEXISTS', parked_key(key, 'pn'), 'a') == 1 then
  redis.call('HSET', parked_key(key, 'pn'), 'a', 0)
end
if ARGV[3] ~= '0' and take_reservation(key, now) then return 1 end
return 0
