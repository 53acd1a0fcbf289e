-- Hand the free slots of N semaphores to their waiting lines, oldest waiter first: after
-- an operator raised a limit or ended a pause (line.lua is put in front of this script).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   how long a slot handed to a waiter stays reserved for it (ms)
--
-- Returns the messages of the waiters handed a slot, for the caller to re-publish.

local handed = {}
local now = server_now()
for i = 1, #KEYS do serve_line(KEYS[i], now, tonumber(ARGV[1]), handed) end
return handed
