-- Give back a start that a rate limiter handed out but that was not used (see admit.lua):
-- a run admitted by a rate limiter on one Redis Cluster node and refused by a limit on
-- another node takes its admission back at once; a run that could not begin at the
-- start booked for it gives that start back.
--
-- KEYS[1]   rate limiter state
-- ARGV[1]   interval between starts (us)
-- ARGV[2]   (a booked start) the 'tat' its booking wrote: the start is given back only
--           if no start was counted since (the state's 'tat' is still that), so that
--           taking it out of the count never lets a later start come closer than the
--           rate allows to one counted after it; else nothing is written (the start
--           is left unused)
-- ARGV[3]   the run's cost in starts (1 if missing)
--
-- With a rate set at run time ('set-rate': the interval in the control hash '}:cr:'),
-- the admission counted the run's cost in intervals of that rate, not ARGV[1]: the start
-- given back is the smaller of the two, never more than was counted (a raised rate's
-- start given back as the configured interval would take starts counted before it out
-- of the count, and let the next runs start closer than the rate allows; with the rate
-- changed again between the booking and this, the smaller is still no more than it took,
-- unless the rate was raised and then lowered within that half second).
--
-- Returns 1 if a start was given back.

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('HGET', KEYS[1], 'tat') or '0') or 0
if tat <= now_us then return 0 end
local booked = tonumber(ARGV[2] or '')
if booked and tat ~= booked then return 0 end
local given = tonumber(ARGV[1])
local control = (string.gsub(KEYS[1], '}:r:', '}:cr:', 1))
local override = tonumber(redis.call('HGET', control, 'interval') or '')
if override and override > 0 then
  given = math.min(given, override * (tonumber(ARGV[3] or '') or 1))
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', math.max(tat - given, now_us)))
return 1
