-- Semaphores in an admission (admit_slots.lua, admit.lua; put in front of them after
-- admit_args.lua, see scripts.py).
--
-- A semaphore is a leased sorted set. Each holder is a member "token acquired_ms fence
-- description" scored by the end of its lease (ms). Reservations of its parked line
-- ('~~<n>', parking.lua) count as holders. Members with negative scores keep statistics
-- and never count: '#fence' (minus the last fencing number), '#slots' (minus the
-- configured number of slots), once a run has been refused or a run parked, '#hold'
-- (minus 1 + the average hold time in ms; -0.5 until a release since), and '#ttl' (see
-- line.lua: when the key's time to live ends). The key lives at least a minute, and at
-- least until its last lease ends. A run of cost k holds k members (units.lua).

-- Read semaphore i (`key`, its spec 's:<slots>' or 's:<slots>:<cost>', ARGV[3+i]) for
-- the run: the limiter when it has a slot for the run, else nil and the reply that
-- refuses it (paused, or full).
local function read_semaphore(i, key, spec)
  local limiter = {kind = 's', key = key}
  local slots_text = string.sub(spec, 3)
  local cost = 1
  local colon = string.find(slots_text, ':', 1, true)
  if colon then  -- a weighted run: 's:<slots>:<cost>'
    cost = tonumber(string.sub(slots_text, colon + 1))
    slots_text = string.sub(slots_text, 1, colon - 1)
  end
  limiter.cost = cost
  limiter.slots = tonumber(slots_text)
  limiter.minus_slots = '-' .. slots_text
  local slots, paused = semaphore_limit(key, limiter.slots, now)
  if paused then return nil, reply(3, i, paused, 0, 0, 0) end
  -- Leases and reservations that ran out are dropped first: an admission always
  -- replaces them, so a late release of one of them says it no longer held its slot.
  redis.call('ZREMRANGEBYSCORE', key, '0', now_text)
  limiter.stats = redis.call('ZMSCORE', key, '#fence', '#hold', TTL_END)
  local used = redis.call('ZCOUNT', key, '(' .. now_text, '+inf')
  local free = slots - used
  -- After a loss of the store's data, no slot is granted until the grace ends.
  local grace = grace_of(key, now, now_us, seen, bound)
  local blocked = free < cost or grace ~= nil
  limiter.last = free <= cost
  if not blocked then return limiter end
  local first = redis.call('ZRANGEBYSCORE', key, '(' .. now_text, '+inf', 'WITHSCORES',
                           'LIMIT', 0, 1)
  local until_first_end = 0
  if first[2] then until_first_end = tonumber(first[2]) - now end
  if grace then until_first_end = math.max(until_first_end, grace - now) end
  local hold = limiter.stats[2]
  if hold then
    hold = -tonumber(hold) - 1
  else
    redis.call('ZADD', key, -0.5, '#hold')  -- contended: releases keep the average
  end
  return nil, reply(0, i, used, until_first_end, hold and hold >= 0 and hold or -1, 0)
end

-- Admitted by every limiter: one fencing number for the whole admission, above the last
-- one of every semaphore (and the server's time in microseconds, so it keeps rising
-- after an idle semaphore was deleted); whether a semaphore is contended (it keeps an
-- average hold time), and whether the run takes the last free slot of one.
local function fence_of(limiters)
  local fence, has_semaphore, contended, last = 0, false, 0, 0
  for i = 1, #KEYS do
    local limiter = limiters[i]
    if limiter.kind == 's' then
      has_semaphore = true
      local stats = limiter.stats
      fence = math.max(fence, stats[1] and (1 - tonumber(stats[1])) or 0)
      if stats[2] then contended = 1 end
      if limiter.last then last = 1 end
    end
  end
  if has_semaphore then fence = math.max(fence, now_us) end
  return fence, contended, last
end

-- Take the run's slots in semaphore `limiter`: its holder `member` until `lease_end`.
local function take_slots(limiter, member, lease_end, lease_end_text, fence_text)
  -- The key lives at least until this lease ends: its time to live is read from its
  -- own record (TTL_END, line.lua), which the same command writes when it is extended.
  local ttl_end = ttl_recorded(limiter.key, limiter.stats[3], now)
  if ttl_end < lease_end then
    local keep = math.max(math.floor(lease * 1.5), STATISTICS_TTL)
    redis.call('ZADD', limiter.key, lease_end_text, member, '-' .. fence_text, '#fence',
               limiter.minus_slots, '#slots', ttl_score(now + keep), TTL_END)
    add_units(limiter.key, token, limiter.cost, lease_end_text)
    redis.call('PEXPIRE', limiter.key, keep)
  else
    redis.call('ZADD', limiter.key, lease_end_text, member, '-' .. fence_text, '#fence',
               limiter.minus_slots, '#slots')
    add_units(limiter.key, token, limiter.cost, lease_end_text)
  end
end
