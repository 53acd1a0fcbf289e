-- Extend one holder's leases in N leased semaphores (see admit.lua; store.lua, units.lua
-- and parked_names.lua are put in front of this script): the end of a claim the holder
-- made on a parked run moves with them (claim_moves).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the holder's member
-- ARGV[2]   new lease length (ms), counted from now on the server's clock
-- ARGV[3]   the incarnation of the store the lease belongs to: its fencing number, or the
--           'born' of the incarnation it was re-asserted in (us); 0: never re-assert
-- ARGV[4]   the longest lease the caller's process knows of (ms): after a loss, the
--           grace lasts at least that long from the new incarnation (store.lua)
-- ARGV[4+i] the holder's cost in semaphore i (units.lua), if above 1; missing: 1; its
--           units are renewed (and re-asserted) with it
--
-- Returns {lease_end_ms, lost, born}: lost counts the semaphores where the holder no
-- longer had a live lease (released, expired, or wiped by a flush or failover). A lease
-- that ran out is never revived, since another holder may have been admitted in its
-- place; its entry is removed. But a lease missing because the store lost its data since
-- the lease was granted (the store's incarnation is newer than the lease, see store.lua)
-- is re-asserted: written back with its token and fencing number, while the grace that
-- follows the loss lasts (ARGV[4] or the lease, at least, from the new incarnation) and
-- a slot is free; born is
-- then that incarnation's 'born', else 0.

local member = ARGV[1]
local lease = tonumber(ARGV[2])
local epoch = tonumber(ARGV[3] or '0') or 0
local bound = math.max(lease, tonumber(ARGV[4] or '0') or 0)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + lease
local lost = 0
local reasserted = 0

local function keep_alive(key)
  if redis.call('PTTL', key) < lease then
    -- never shorter: PTTL was below the lease; recorded as admit.lua reads it ('#ttl')
    redis.call('ZADD', key, string.format('%d', 1000 - lease_end), '#ttl')
    redis.call('PEXPIRE', key, lease)
  end
end

-- Write the member back into `key` after a loss of the store's data; the new
-- incarnation's 'born', or nil if it may not be.
local function reassert(key, cost)
  local marker = incarnation_key(key)
  if epoch <= 0 or not marker then return nil end
  local state = incarnation(marker)
  if state == false then return nil end
  local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  if state == nil then state = new_incarnation(marker, now, now_us, bound) end
  local born_ms = math.floor(state[1] / 1000)
  if state[1] <= epoch or now >= born_ms + lease then return nil end
  local slots = redis.call('ZSCORE', key, '#slots')
  if slots and redis.call('ZCOUNT', key, '(' .. now, '+inf') + cost > -tonumber(slots) then
    return nil  -- granted afresh meanwhile (by a caller that had seen no incarnation)
  end
  extend_grace(marker, state, bound, true)  -- no slot afresh until the grace ends
  local fence = tonumber(string.match(member, '^%S+ %S+ (%d+)') or '0')
  local last = redis.call('ZSCORE', key, '#fence')
  if not last or -tonumber(last) < fence then
    redis.call('ZADD', key, '-' .. string.format('%d', fence), '#fence')
  end
  redis.call('ZADD', key, lease_end, member)
  add_units(key, token_of(member), cost, lease_end)
  keep_alive(key)
  return state[1]
end

for i = 1, #KEYS do
  local key = KEYS[i]
  local cost = cost_of(4, i)
  local current = redis.call('ZSCORE', key, member)
  if current and tonumber(current) > now then
    redis.call('ZADD', key, 'XX', lease_end, member)
    add_units(key, token_of(member), cost, lease_end, 'XX')
    claim_moves(key, token_of(member), lease_end)
    keep_alive(key)
  else
    if current then
      redis.call('ZREM', key, member)
      remove_units(key, token_of(member), cost)
    end
    local born = not current and reassert(key, cost)
    if born then reasserted = born else lost = lost + 1 end
  end
end
return {lease_end, lost, reasserted}
