-- Weighted runs on the parked line (a task's lock_cost): a slot handed to the line is
-- reserved in units of the cost of the run at the head of the parking queue, so a
-- heavy head keeps the free units for itself until enough are free (nobody overtakes:
-- a newcomer parks while anyone waits). (This text is put in
-- front of the scripts after units.lua and fair.lua, before parking.lua; scripts.py.)
--
-- Companion of a semaphore K (same hash tag, see parking.lua):
--
--   '}:pk:'  list, the costs of the parked runs no move was owed for yet, in the order
--            they parked, run-length encoded ('<cost> <count>' entries): O(1) to read
--            the head's cost, to append and to pop. Missing or empty: every run costs 1
--            (a line with no weighted run never writes it).
--
-- A reservation of cost c is its member '~~<n>' and units '~~<n>*2'..'~~<n>*c' of K
-- (units.lua), recorded in '}:pv:' as '<n>' (cost 1) or '<n>*<c>'. The list follows the
-- parking queue's order, not each run: a moved copy whose cost differs from its
-- reservation's takes it only with enough units free besides (else it parks again),
-- so a mismatch (after a loss of the store, a fair line's sub-lines, which share the
-- key's list) costs a turn, never the limit.

local PARKED_COST_TTL = 7 * 24 * 3600 * 1000

local function cost_fifo(key)
  local at = string.find(key, '}:s:', 1, true)
  if not at then return key .. ':pk' end
  return string.sub(key, 1, at) .. ':pk:' .. string.sub(key, at + 4)
end

-- A run of `cost` parks at `key` behind `ahead` runs no move was owed for (those the
-- list does not know cost 1).
local function cost_parked(key, cost, ahead)
  local name = cost_fifo(key)
  local tail = redis.call('LINDEX', name, -1)
  if not tail then
    if cost <= 1 then return end
    if ahead > 0 then redis.call('RPUSH', name, '1 ' .. ahead) end
    redis.call('RPUSH', name, cost .. ' 1')
  else
    local last, count = string.match(tail, '^(%d+) (%d+)$')
    if tonumber(last) == cost then
      redis.call('LSET', name, -1, last .. ' ' .. (tonumber(count) + 1))
    else
      redis.call('RPUSH', name, cost .. ' 1')
    end
  end
  if redis.call('PTTL', name) < PARKED_COST_TTL / 2 then
    redis.call('PEXPIRE', name, PARKED_COST_TTL)
  end
end

-- A move was owed for the head of `key`'s parking queue: its cost leaves the list.
local function cost_moved(key)
  local name = cost_fifo(key)
  local head = redis.call('LINDEX', name, 0)
  if not head then return end
  local cost, count = string.match(head, '^(%d+) (%d+)$')
  if tonumber(count) <= 1 then
    redis.call('LPOP', name)
  else
    redis.call('LSET', name, 0, cost .. ' ' .. (tonumber(count) - 1))
  end
end

-- The costs of the heads of `key`'s line that `free` units admit, in order, at most
-- `waiting` of them, each popped from the list: a head that needs more than are left
-- stops it (they stay free for it).
local function parked_costs(key, free, waiting)
  local costs = {}
  if redis.call('EXISTS', cost_fifo(key)) == 0 then
    for _ = 1, math.min(free, waiting) do costs[#costs + 1] = 1 end
    return costs
  end
  while #costs < waiting and free > 0 do
    local head = redis.call('LINDEX', cost_fifo(key), 0)
    local cost = head and tonumber(string.match(head, '^(%d+)')) or 1
    if cost > free then break end
    cost_moved(key)
    costs[#costs + 1] = cost
    free = free - cost
  end
  return costs
end

-- The cost of reservation `member` of '}:pv:' ('<n>' or '<n>*<c>'), and its number.
local function reservation_cost(member)
  local number, cost = string.match(member, '^([^*]+)%*?(%d*)$')
  return tonumber(cost) or 1, number
end
