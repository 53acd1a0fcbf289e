-- Give back a start that a rate limiter handed out but that was not used (see admit.lua):
-- a run admitted by a rate limiter on one Redis Cluster node and refused by a limit on
-- another node takes its admission back.
--
-- KEYS[1]   rate limiter state
-- ARGV[1]   interval between starts (us)
--
-- Returns 1 if a start was given back.

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('HGET', KEYS[1], 'tat') or '0') or 0
if tat <= now_us then return 0 end
redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', math.max(tat - tonumber(ARGV[1]), now_us)))
return 1
