-- Write a new incarnation of the store without a grace (store.lua is put in front of this
-- script): the store was emptied on purpose, no holder is to re-assert its lease.
--
-- KEYS[1]   the incarnation key '<prefix>incarnation'

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
new_incarnation(KEYS[1], now, tonumber(clock[1]) * 1000000 + tonumber(clock[2]), 0)
return 1
