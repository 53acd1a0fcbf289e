-- How many slots of a semaphore a plain acquire (Semaphore.acquire) could take now, on the
-- server's clock: none while it is paused; else the limit (the operator's override, else
-- the configured count) less the live leases and reservations, less the waiters in its
-- line that have no reservation yet, each its cost in slots (free slots are theirs first;
-- a waiter costing more than the limit could never be served and is passed over). Reads
-- only.
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the configured number of slots

local key = KEYS[1]
local now = server_now()
local slots, paused = semaphore_limit(key, tonumber(ARGV[1]), now)
if paused then return 0 end
local free = slots - redis.call('ZCOUNT', key, '(' .. now, '+inf')
local line = companion(key, 'q')
local records = companion(key, 'w')
local start = 0
while free > 0 do
  local tickets = redis.call('ZRANGE', line, start, start + 99)
  if #tickets == 0 then break end
  for _, ticket in ipairs(tickets) do
    local reserved = tonumber(redis.call('ZSCORE', key, RESERVED .. ticket) or '0')
    if reserved <= now then
      local cost = tonumber(redis.call('HGET', records, 'c:' .. ticket) or '1') or 1
      if cost <= slots then free = free - cost end
    end
    if free <= 0 then break end
  end
  start = start + 100
end
if free < 0 then return 0 end
return free
