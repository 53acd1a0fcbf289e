-- Take a task's tickets out of N waiting lines: it gave up, or it was revoked, and must
-- not be handed a slot (line.lua is put in front of this script).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   ticket prefix: the task id and a dot
--
-- Returns how many tickets were dropped; their reservations, if any, are dropped too.

local prefix = ARGV[1]
local dropped = 0
for i = 1, #KEYS do
  local key = KEYS[i]
  for _, ticket in ipairs(redis.call('ZRANGE', companion(key, 'q'), 0, -1)) do
    if string.sub(ticket, 1, #prefix) == prefix then
      local cost = tonumber(redis.call('HGET', companion(key, 'w'), 'c:' .. ticket) or '1')
      forget_ticket(key, ticket)
      drop_reservation(key, ticket, cost or 1)
      dropped = dropped + 1
    end
  end
end
return dropped
