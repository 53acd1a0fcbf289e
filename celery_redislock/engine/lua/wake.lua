-- Hand the free slots of N semaphores to their parked lines: after an operator raised a
-- limit or ended a pause, or after a release that did not hand over (a line formed while
-- the slot was held). (store.lua, units.lua, fair.lua, parked_cost.lua, parking.lua,
-- deadline.lua and line.lua are put in front of this script.)
--
-- KEYS[i]   semaphore i
-- ARGV[1]   how long a slot handed to a parked line stays reserved for it (ms)
--
-- Returns the moves owed out of the parking queues ('!move <count> <key>', parking.lua).

local handed = {}
local now = server_now()
for i = 1, #KEYS do serve_line(KEYS[i], now, tonumber(ARGV[1]), handed) end
return handed
