-- Register one start of a worker, or renew its registration (see workers.py), and read
-- the store's incarnation (store.lua is put in front of this script).
--
-- KEYS[1]   the registration key '<prefix>worker:<node>:<start id>'
-- ARGV[1]   its description (JSON)
-- ARGV[2]   its lease (ms)
-- ARGV[3]   the latest incarnation of the store the worker saw (0 if none, see store.lua)
-- ARGV[4]   the grace after a loss (ms): the longest lease of the worker's limits (it
--           extends a grace that is shorter, see store.lua)
-- ARGV[5]   the start of the key space's keys ('<prefix>{'), to find its incarnation;
--           '' on Redis Cluster (none)
--
-- Returns the incarnation's 'born' (us), or 0 where it cannot be read (Redis Cluster).

redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local marker = incarnation_key(ARGV[5])
if not marker then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local state = incarnation_for(marker, now, now_us, tonumber(ARGV[3]), tonumber(ARGV[4]))
if not state then return 0 end
return state[1]
