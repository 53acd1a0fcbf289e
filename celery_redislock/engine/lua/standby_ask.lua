-- Ask for a standby (standby.lua): one move owed with no slot reserved (standby_owe.lua,
-- with what it needs, is put in front of this script; see engine/standby.py). The copy
-- moved is held by the worker that receives it, or parks again.
--
-- KEYS[1]   the semaphore
--
-- Returns the moves owed ('!move 1 <key>[\031<sub>]', see parking.lua): none or one.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local out = {}
standby_owe(KEYS[1], now, out)
return out
