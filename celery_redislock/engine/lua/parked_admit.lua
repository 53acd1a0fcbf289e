-- The parts of an admission on the parked line, one semaphore at a time: read it, park a
-- run there, claim its reference, hold a slot. Shared by the parked line's admissions
-- (put in front of them after line.lua; see scripts.py). A semaphore is read into a
-- table `l`: key, slots, configured slots, paused (its pause's end, or nil), cost (the
-- units the run takes), stats (ZMSCORE '#fence' '#hold' '#ttl'), counts (parking.lua's
-- parked_line, {0, 0} for none), ref (the run's reference there, or nil), used, free.

-- Read semaphore `key` (`configured` slots) for `run` of `cost` units at `now`.
local function read_semaphore(key, configured, cost, run, now)
  local now_text = string.format('%d', now)
  local slots, paused = semaphore_limit(key, tonumber(configured), now)
  redis.call('ZREMRANGEBYSCORE', key, '0', now_text)
  local l = {key = key, slots = slots, configured = configured, paused = paused, cost = cost}
  l.stats = redis.call('ZMSCORE', key, '#fence', '#hold', '#ttl')
  l.counts = parked_line(key)
  if l.counts then  -- else the key never had a parked line: no reference to read
    prune_served(key, now)
    lapse_claims(key, now)
    lapse_unsent(key, now, l.counts)  -- references whose copy never came (parked_unsent.lua)
    l.ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
    -- the run asks again: its reference's copy came, or it is the message itself
    if l.ref and l.ref.state == 'w' then copy_sent(key, run, l.ref.park_id, l.counts) end
  else
    l.counts = {0, 0}
  end
  l.used = redis.call('ZCOUNT', key, '(' .. now_text, '+inf')
  l.free = slots - l.used
  return l
end

-- Whether the holder with token `holder` has a live lease in `key` (a walk of its live
-- holders, bounded by its slots: only for a copy that finds its reference claimed).
local function holder_live(key, holder, now)
  if holder == '' then return false end
  local now_text, start = string.format('%d', now), 0
  while true do
    local members = redis.call('ZRANGEBYSCORE', key, '(' .. now_text, '+inf', 'LIMIT', start, 100)
    if #members == 0 then return false end
    for _, member in ipairs(members) do
      if token_of(member) == holder and string.find(member, ' ', 1, true) then return true end
    end
    start = start + 100
  end
end

-- Whether the reservation of `l` that ends first, with the units free, admits its cost.
local function reservation_fits(l, now)
  if live_reservations(l.key, now) == 0 then return false end
  local first = redis.call('ZRANGEBYSCORE', parked_key(l.key, 'pv'),
                           '(' .. string.format('%d', now), '+inf', 'LIMIT', 0, 1)
  if #first == 0 then return false end
  local reserved = reservation_cost(first[1])
  return reserved >= l.cost or l.free >= l.cost - reserved
end

local function claimed_live(l, now)
  return l.ref and l.ref.state == 'c' and holder_live(l.key, l.ref.holder, now)
end

-- A copy whose reference at `l` is claimed by a live holder goes back to parking as it
-- is: the reference is marked, so that it is kept for that copy if the claim lapses
-- (parking.lua's lapse_claims).
local function claimed_again(l, run)
  local ref = l.ref
  if ref.again == '' then
    write_ref(l.key, run, 'c', ref.since, ref.park_id, ref.holder, 'a', ref.copy)
  end
end

-- A served reference at `l` whose copy id is `copy` (not ''): the very copy asking
-- again (its admission's reply lost, or given back by the broker unacknowledged) runs
-- again, as Celery runs it: read as claimed by a holder no longer live, under its park
-- id `park_id`. A copy of another id (two copies of one move) stays stale.
local function rerun_ref(l, copy, park_id)
  local ref = l.ref
  if ref and ref.state == 's' and copy ~= '' and ref.copy == copy then
    l.ref = {state = 'c', since = ref.since, park_id = park_id, holder = '', again = '',
             copy = copy}
  end
end

-- A moved copy's reference at its home `h` (false: none), if it waits under park id
-- `id`, is dropped: the run parks elsewhere or ends. True if it was.
local function leave_home(h, run, id)
  if not (h and id ~= '' and h.ref and h.ref.state == 'w' and h.ref.park_id == id) then
    return false
  end
  redis.call('HDEL', parked_key(h.key, 'pr'), run)
  count_down_waiting(h.key, h.counts)
  return true
end

-- One anonymous entry of `l` less (a moved copy the store did not know).
local function count_down_anonymous(l)
  if l.counts[2] > 0 then
    redis.call('HINCRBY', parked_key(l.key, 'pn'), 'a', -1)
    l.counts[2] = l.counts[2] - 1
  end
end

-- Write the run's waiting reference at `l` (a new park id in incarnation `born`, since
-- `since`), count it, mark `l` contended and index it in `index`: returns the park id.
local function park_reference(l, run, born, since, keep, index, now)
  local ref, counts = l.ref, parked_key(l.key, 'pn')
  local id = born .. ':' .. redis.call('HINCRBY', counts, 'n', 1)
  if not (ref and ref.state == 'w') then redis.call('HINCRBY', counts, 'w', 1) end
  if ref and ref.state == 'c' then claim_until(l.key, ref.holder, nil) end
  write_ref(l.key, run, 'w', since, id, '')
  redis.call('HSET', counts, 'k', keep, 's', l.configured)
  keep_parked(counts)
  mark_parked(l.key, now)  -- contended: releases hand over
  redis.call('ZADD', index, now, l.key)  -- the poll's index of parked lines
  keep_parked(index)  -- which lives as long as the lines it names
  return id
end

-- The fields of a refusal at `l`: {holders, ms until the first lease ends (the grace's
-- end if later; a pause's end, -1 for none), the average hold (ms, -1 unknown)}.
local function refusal_fields(l, now, grace)
  local first = redis.call('ZRANGEBYSCORE', l.key, '(' .. string.format('%d', now), '+inf',
                           'WITHSCORES', 'LIMIT', 0, 1)
  local until_first_end = first[2] and tonumber(first[2]) - now or 0
  if grace then until_first_end = math.max(until_first_end, grace - now) end
  if l.paused then until_first_end = l.paused < 0 and -1 or l.paused - now end
  local hold = l.stats[2] and -tonumber(l.stats[2]) - 1 or -1
  return l.used, until_first_end, hold >= 0 and hold or -1
end

-- Admitted by every semaphore of `limiters`: a fencing number above every one's last,
-- 1 if any is contended (holders in a line, or a parked line), 1 if it takes a last slot.
local function admission_marks(limiters, now_us)
  local fence, contended, last = now_us, 0, 0
  for _, l in ipairs(limiters) do
    if l.stats[1] then fence = math.max(fence, 1 - tonumber(l.stats[1])) end
    if l.stats[2] or l.ref or l.counts[1] + l.counts[2] > 0 then contended = 1 end
    if l.take == 'free' and l.free <= l.cost then last = 1 end
  end
  return fence, contended, last
end

-- Admitted at `l`: its reservation taken (if it takes one), the run's reference there
-- claimed by holder `token` (and copy id `copy`, acks late) until its body starts
-- (default acks) or ends (acks late), or its lease ends unreleased (parking.lua's
-- lapse_claims), and the holder `member` added until `lease_end` (ms). `sub`: the run's
-- sub-line there.
local function hold_slot(l, run, token, member, fence_text, lease, lease_end, now, sub, copy)
  local ref = l.ref
  if l.take == 'reserved' then take_reservation(l.key, now, copy) end
  if ref and (ref.state == 'w' or ref.state == 'c') then
    local claims = parked_key(l.key, 'pc')
    if ref.state == 'w' then
      count_down_waiting(l.key, l.counts)
      drop_deadline(l.key, run, sub)
    end
    if ref.state == 'c' then claim_until(l.key, ref.holder, nil) end
    write_ref(l.key, run, 'c', ref.since, ref.park_id, token, '', copy)
    redis.call('HSET', claims, token, run)
    keep_parked(claims)
    claim_until(l.key, token, lease_end)
  end
  local lease_end_text = string.format('%d', lease_end)
  redis.call('ZADD', l.key, lease_end_text, member, '-' .. fence_text, '#fence',
             '-' .. l.configured, '#slots')
  add_units(l.key, token, l.cost, lease_end_text)  -- a weighted run's units (units.lua)
  local ttl_end = ttl_recorded(l.key, l.stats[3], now)
  if ttl_end < lease_end then
    local ttl = math.max(math.floor(lease * 1.5), 60000)
    redis.call('ZADD', l.key, ttl_score(now + ttl), TTL_END)
    redis.call('PEXPIRE', l.key, ttl)
  end
end
