-- The poll of the parked lines (each worker sends it every ~100-250 ms): hand over the
-- slots freed without a release (a lease ran out, a reservation lapsed or was given
-- back, the grace after a loss of the store's data ended), and count a parking queue
-- whose line knows nobody (the store lost its data; a park in flight across the loss)
-- as that many anonymous entries. (store.lua, units.lua, parking.lua and line.lua are
-- put in front of this script.)
--
-- KEYS[i]     semaphore i (1..N); KEYS[N+1] the key space's index of parked lines
-- ARGV[1]     how long a slot handed to the line stays reserved (ms)
-- ARGV[2]     the latest incarnation the caller saw (admit.lua; -1: Redis Cluster)
-- ARGV[3]     the longest lease (ms) the caller's process knows of (store.lua): a poll
--             that is the first to find the store emptied starts the grace, as an
--             admission would
-- ARGV[3+i]   how many messages semaphore i's parking queue holds (-1: unknown)
--
-- Returns {born, move...}: the incarnation ('born', 0 if none) and the moves owed,
-- '!move <count> <key>' entries (see parking.lua). A key whose line is empty (no
-- reference waiting, no anonymous entry, no live reservation) and whose parking queue
-- is empty leaves the index.

local N = #KEYS - 1
local reserve = tonumber(ARGV[1])
local seen = tonumber(ARGV[2]) or 0
local bound = tonumber(ARGV[3]) or 0
local now, now_us = server_now()
local out = {0}
local grace = nil
local marker = N > 0 and incarnation_key(KEYS[1])
if marker and seen >= 0 then
  local state = incarnation_for(marker, now, now_us, seen, bound)
  if state then
    out[1] = state[1]
    if state[2] > now then grace = state[2] end
  end
end

for i = 1, N do
  local key = KEYS[i]
  local length = tonumber(ARGV[3 + i]) or -1
  local counts = parked_line(key) or {0, 0}
  local reserved = live_reservations(key, now)
  prune_served(key, now)
  if counts[1] + counts[2] == 0 and reserved == 0 then
    if length > 0 then
      local names = parked_key(key, 'pn')
      redis.call('HSET', names, 'a', length)
      keep_parked(names)
      redis.call('ZADD', key, 'NX', -0.5, '#hold')  -- contended: releases hand over
      redis.call('ZADD', KEYS[N + 1], now, key)
      counts[2] = length
    elseif length == 0 then
      redis.call('ZREM', KEYS[N + 1], key)
    end
  end
  if counts[1] + counts[2] > 0 and not grace then
    redis.call('ZREMRANGEBYSCORE', key, 0, now)
    local parked = parked_line(key)
    local slots, paused = semaphore_limit(key, configured_slots(key, parked), now)
    if not paused then
      local free = slots - redis.call('ZCOUNT', key, '(' .. now, '+inf')
      hand_over_parked(key, free, now, reserve, out, parked)
    end
  end
end
return out
