-- Put a run that found a semaphore full in its waiting line, then hand any slot that is
-- free by now to the line (a release may have come between the refusal and this call).
-- (line.lua is put in front of this script when it is loaded.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the run's ticket
-- ARGV[2]   when the run first asked (ms, server clock): its place in the line
-- ARGV[3]   waiter record (JSON, for operators)
-- ARGV[4]   the run's message, re-published when it is handed a slot
-- ARGV[5]   how long the ticket is kept without news of the run (ms)
-- ARGV[6]   how long a slot handed to a waiter stays reserved for it (ms)
-- ARGV[7]   the run's cost in slots (units.lua), if above 1; missing: 1
--
-- Returns {position, message...}: the ticket's place in the line (0 = first) and the
-- messages of waiters handed a slot, for the caller to re-publish (maybe its own).

local key = KEYS[1]
local ticket = ARGV[1]
local keep_ticket = tonumber(ARGV[5])
local reserve = tonumber(ARGV[6])
local now = server_now()

prune_tickets(key, now)
mark_line(key)
redis.call('ZADD', companion(key, 'q'), 'NX', ARGV[2], ticket)
redis.call('HSET', companion(key, 'w'), ticket, ARGV[3], 'm:' .. ticket, ARGV[4])
if cost_of(6, 1) > 1 then
  redis.call('HSET', companion(key, 'w'), 'c:' .. ticket, ARGV[7])
end
redis.call('ZADD', companion(key, 'x'), now + keep_ticket, ticket)
keep_line(key, keep_ticket + 60000, {'q', 'w', 'x'})

local handed = {}
serve_line(key, now, reserve, handed)
local answer = {redis.call('ZRANK', companion(key, 'q'), ticket) or -1}
for _, message in ipairs(handed) do answer[#answer + 1] = message end
return answer
