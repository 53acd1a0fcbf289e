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
--             admission would (if the caller saw an incarnation; else it does nothing)
-- ARGV[3+i]   how many messages semaphore i's parking queue holds (-1: unknown)
--
-- The first poll in an incarnation counts each parking queue: the messages no reference
-- waits for are anonymous entries (after a loss of the store's data, all of them). A
-- line whose references wait while its parking queue stays empty for a minute is
-- counted empty again by a poll that finds nothing reserved (see below).
--
-- Returns {born, move...}: the incarnation ('born', 0 if none) and the moves owed,
-- '!move <count> <key>' entries (see parking.lua), and '!late <count> <key>' for the
-- deadline moves (deadline.lua: heads moved to be given up, no slot reserved for them).
-- A key whose line is empty (no reference waiting, no anonymous entry, no live
-- reservation, no claim) and whose parking queue is empty leaves the index.

local STALE_MS = 60000
local N = #KEYS - 1
local reserve = tonumber(ARGV[1])
local seen = tonumber(ARGV[2]) or 0
local bound = tonumber(ARGV[3]) or 0
local now, now_us = server_now()
local out = {0}
local grace = nil
local marker = N > 0 and incarnation_key(KEYS[1])
if marker and seen >= 0 then
  -- A missing incarnation is written only by a caller that saw one (a loss: with its
  -- grace). A caller that saw none (a process just started) writes nothing and hands
  -- nothing over: the store may have lost its data, and the grace is the admissions' to
  -- start, which know the leases.
  local state = incarnation_for(marker, now, now_us, seen > 0 and seen or nil, bound)
  if state then
    out[1] = state[1]
    if state[2] > now then grace = state[2] end
  elseif state == nil then
    return out
  end
end

local born = string.format('%d', out[1])

for i = 1, N do
  local key = KEYS[i]
  local length = tonumber(ARGV[3 + i]) or -1
  lapse_unsent(key, now)  -- references whose copy never came (parked_unsent.lua)
  local counts = parked_line(key)
  local reserved = live_reservations(key, now)
  prune_served(key, now)
  lapse_claims(key, now)  -- claims whose holder's lease ran out unreleased (parking.lua)
  if length >= 0 and (counts or length > 0) and (counts or {})[5] ~= born then
    -- First count in this incarnation (the store lost its data, or never counted): the
    -- parking queue's messages that no reference waits for are anonymous entries.
    counts = counts or {0, 0}
    counts[2] = math.max(0, length - counts[1])
    local names = parked_key(key, 'pn')
    redis.call('HSET', names, 'a', counts[2], 'i', born)
    keep_parked(names)
  end
  counts = counts or {0, 0}
  if length == 0 and counts[1] > 0 then
    -- References wait and the parking queue is empty: their copies are in flight
    -- (parked, not yet published, or moved and not yet admitted), or gone (a broker that
    -- lost them, a moved copy lost in kombu's window between a killed worker's BRPOP
    -- and its unacked hash, or that Celery ended at receipt, revoked or expired). Seen
    -- so for STALE_MS, the count is cleared once nothing is reserved (the references
    -- stay: a copy that still comes is known, and the count only decides hand-overs and
    -- who goes first). A live reservation does not restart the minute: the polls' own
    -- hand-overs to such a line reserve a slot each time (a move that finds the queue
    -- empty gives it back), and some worker's poll nearly always sees one.
    if not counts[4] then
      redis.call('HSET', parked_key(key, 'pn'), 'e', now)
    elseif reserved == 0 and now - counts[4] > STALE_MS then
      redis.call('HSET', parked_key(key, 'pn'), 'w', 0)
      redis.call('HDEL', parked_key(key, 'pn'), 'e')
      counts[1] = 0
    end
  elseif counts[4] then
    redis.call('HDEL', parked_key(key, 'pn'), 'e')
  end
  if counts[2] > 0 then
    mark_parked(key, now)  -- contended: releases hand over
  end
  if counts[1] + counts[2] == 0 and reserved == 0 then
    if length > 0 then
      local names = parked_key(key, 'pn')
      redis.call('HSET', names, 'a', length)
      keep_parked(names)
      mark_parked(key, now)  -- contended: releases hand over
      redis.call('ZADD', KEYS[N + 1], now, key)
      keep_parked(KEYS[N + 1])  -- the index lives as long as the lines it names
      counts[2] = length
    elseif length == 0 and redis.call('EXISTS', parked_key(key, 'pc')) == 0 then
      redis.call('ZREM', KEYS[N + 1], key)  -- no live claim left to lapse either
      redis.call('DEL', cost_fifo(key))  -- nothing parked: no cost to keep (parked_cost.lua)
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
  if counts[1] > 0 and not grace then
    deadline_moves(key, now, out)  -- runs parked past their max wait (deadline.lua)
  end
end
return out
