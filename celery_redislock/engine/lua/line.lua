-- The waiting line of a semaphore: shared by the scripts that admit, queue and release.
-- (This text is put in front of those scripts when they are loaded; see scripts.py.)
--
-- A semaphore key K = '<prefix>{<digest>}:s:<name>' has companion keys with the same
-- hash tag, so one script may use them on Redis Cluster too:
--
--   '}:q:'  the line: sorted set, ticket -> when the run first asked (ms). Oldest first.
--   '}:w:'  hash: ticket -> waiter record (JSON, for operators),
--                 'm:' .. ticket -> the run's message, re-published when it is served,
--                 'd:' .. ticket -> once served, which copy of the message was admitted,
--                 'c:' .. ticket -> the run's cost in slots, when above 1 (units.lua),
--                 'p:' .. ticket -> the starts rate limiters promised the waiter (JSON,
--                 rate key -> us), kept for whichever copy of its message asks
--   '}:x:'  sorted set, ticket -> when the ticket is forgotten (ms): a waiter whose message
--           never came back is dropped then, and a served ticket is remembered until
--           then, so that the other copy of its message (the one sent back with a
--           countdown) finds it was served and does not run the task again
--   '}:cs:' control hash, written by operators: 'slots' overrides the configured number
--           of slots, 'paused_until' (ms, or 'forever') refuses every run until then
--
-- In K, a member '~' .. ticket is a reservation: a slot kept for that waiter while its
-- message travels to a worker, scored by the end of the reservation like a lease (with
-- its units '~' .. ticket .. '*2'..., for a waiter that costs more than one slot); a
-- waiter that also has a rate limit keeps it until a little after its promised start.
--
-- The line is served strictly in order: a waiter that needs more slots than are free
-- keeps them free for itself (nobody behind it takes them) until enough are, so heavy
-- runs are never starved by light ones. A waiter whose cost is above the limit in force
-- (an operator lowered it) could never be served: it is passed over, and waits without
-- holding up the line until the limit is raised again.

local RESERVED = '~'

local function companion(key, mark)
  local at = string.find(key, '}:s:', 1, true)
  if not at then return key .. ':' .. mark end
  return string.sub(key, 1, at) .. ':' .. mark .. ':' .. string.sub(key, at + 4)
end

local function server_now()
  local clock = redis.call('TIME')
  local seconds, micros = tonumber(clock[1]), tonumber(clock[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
end

-- 'paused_until' of a control hash: the end of the pause (ms, -1 = forever), or nil.
local function pause_end(value, now)
  if not value then return nil end
  if value == 'forever' then return -1 end
  local until_ms = tonumber(value)
  if until_ms and until_ms > now then return until_ms end
  return nil
end

-- The number of slots of semaphore `key`: the operator's override, else `configured`
-- (else what the last admission recorded in '#slots'); and the end of a pause, or nil.
local function semaphore_limit(key, configured, now)
  local control = redis.call('HMGET', companion(key, 'cs'), 'slots', 'paused_until')
  local slots = tonumber(control[1] or '') or configured
  if not slots then
    local recorded = redis.call('ZSCORE', key, '#slots')
    slots = recorded and -tonumber(recorded) or 1
  end
  return slots, pause_end(control[2], now)
end

local function forget_ticket(key, ticket)
  redis.call('ZREM', companion(key, 'q'), ticket)
  redis.call('HDEL', companion(key, 'w'), ticket, 'm:' .. ticket, 'd:' .. ticket,
             'c:' .. ticket, 'p:' .. ticket)
  redis.call('ZREM', companion(key, 'x'), ticket)
end

-- Drop the reservation of `ticket` in `key`, for a waiter of `cost` slots.
local function drop_reservation(key, ticket, cost)
  redis.call('ZREM', key, RESERVED .. ticket)
  remove_units(key, RESERVED .. ticket, cost)
end

-- Drop the tickets whose time ran out (at most 100 a call).
local function prune_tickets(key, now)
  local xkey = companion(key, 'x')
  local old = redis.call('ZRANGEBYSCORE', xkey, '-inf', now, 'LIMIT', 0, 100)
  for _, ticket in ipairs(old) do forget_ticket(key, ticket) end
end

-- A semaphore records when its time to live ends, as the member TTL_END scored minus
-- that time (ms), less a second of margin, written by every script that extends it (in
-- the same call): a script reads it with the semaphore's other statistics instead of
-- asking PTTL. A key written before the record was kept is asked (ttl_recorded).
local TTL_END = '#ttl'

local function ttl_score(expires_ms)
  return string.format('%d', 1000 - expires_ms)
end

-- When the time to live of semaphore `key` ends (ms), from its record `recorded` (the
-- score of TTL_END, or false); before `now` if it has none.
local function ttl_recorded(key, recorded, now)
  if recorded then return -tonumber(recorded) end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then return now - 1 end
  return now + ttl
end

-- Extend the time to live of semaphore `key` to `ms` from `now`, and record it.
local function extend_semaphore(key, ms, now)
  redis.call('ZADD', key, ttl_score(now + ms), TTL_END)
  redis.call('PEXPIRE', key, ms)
end

-- Keep the given companion keys of the line (marks, e.g. {'w', 'x'}) alive at least `ms`
-- longer (they hold nothing that must outlive that). A key is given half as long again
-- when it runs short, so that most calls find it long enough and write nothing. The
-- semaphore itself lives at least as long as its line ('q'): its '#hold' says that it
-- may have one (see mark_line).
local function keep_line(key, ms, marks)
  for _, mark in ipairs(marks) do
    local companion_key = companion(key, mark)
    local ttl = redis.call('PTTL', companion_key)
    if ttl < ms then
      ttl = math.floor(ms * 1.5)
      redis.call('PEXPIRE', companion_key, ttl)
      -- Only the line's extension can take it past the semaphore's end (nothing
      -- shortens the semaphore's time to live).
      if mark == 'q' and redis.call('PTTL', key) < ttl then
        extend_semaphore(key, ttl, server_now())
      end
    end
  end
end

-- A semaphore whose line gets a waiter is marked contended ('#hold', see admit.lua), if
-- it is not yet: admissions and releases look for a line only in a semaphore so marked.
local function mark_line(key)
  redis.call('ZADD', key, 'NX', -0.5, '#hold')
end

-- Walk the line from the front and hand each waiter that has no reservation its cost in
-- slots (1 unless its 'c:' field says more) out of the `free` ones: a reservation until
-- now + reserve_ms, and its message is appended to `out` for the caller to re-publish.
-- A waiter that needs more than are free stops the walk (`blocked`): the free slots stay
-- for it. With reserve_ms 0 (a caller that cannot publish), a waiter without a
-- reservation only blocks. A waiter that costs more than `slots` is passed over.
-- Stops at ticket `me` (the run that is asking), which is then `reached`; otherwise it
-- stops when the slots run out before the end of the line (`blocked`).
-- Returns the slots left free, reached, blocked.
local function hand_over(key, free, now, reserve_ms, me, out, slots)
  local qkey = companion(key, 'q')
  local wkey = companion(key, 'w')
  local index = 0
  while true do
    local batch = redis.call('ZRANGE', qkey, index, index + 15)
    if #batch == 0 then return free, false, false end
    for _, ticket in ipairs(batch) do
      if ticket == me then return free, true, false end
      local reserved = redis.call('ZSCORE', key, RESERVED .. ticket)
      if not (reserved and tonumber(reserved) > now) then
        if free <= 0 then return free, false, true end
        local fields = redis.call('HMGET', wkey, 'm:' .. ticket, 'c:' .. ticket)
        local message, cost = fields[1], tonumber(fields[2] or '1') or 1
        if not message then
          forget_ticket(key, ticket)  -- nothing to re-publish: not a waiter any more
          index = index - 1
        elseif cost <= slots then
          if reserve_ms <= 0 or cost > free then return free, false, true end
          redis.call('ZADD', key, now + reserve_ms, RESERVED .. ticket)
          add_units(key, RESERVED .. ticket, cost, now + reserve_ms)
          out[#out + 1] = '@' .. wkey .. ' m:' .. ticket .. '\n' .. message
          free = free - cost
        end
      end
    end
    index = index + #batch
  end
end

-- The configured slots of semaphore `key` for a hand-over: nil (its '#slots' says), or
-- what its parked line recorded (`parked`, see parking.lua) when '#slots' is gone.
local function configured_slots(key, parked)
  if not (parked and parked[3]) or redis.call('ZSCORE', key, '#slots') then return nil end
  return parked[3]
end

-- Hand the free slots of semaphore `key` to its line, if it has one: the waiting line's
-- messages, then the parked line's moves owed (parking.lua), appended to `out`.
local function serve_line(key, now, reserve_ms, out)
  if reserve_ms <= 0 then return end
  local queued = redis.call('EXISTS', companion(key, 'q')) == 1
  local parked = parked_line(key)
  if not (queued or parked) then return end
  if grace_of(key, now) then return end  -- after a loss of the store: nothing afresh yet
  if queued then prune_tickets(key, now) end
  redis.call('ZREMRANGEBYSCORE', key, 0, now)
  local slots, paused = semaphore_limit(key, configured_slots(key, parked), now)
  if paused then return end
  local free = slots - redis.call('ZCOUNT', key, '(' .. now, '+inf')
  if free > 0 and queued then
    local _, blocked
    free, _, blocked = hand_over(key, free, now, reserve_ms, '', out, slots)
    if blocked then return end  -- the free slots are kept for the waiting line's first
  end
  if free > 0 and parked then hand_over_parked(key, free, now, reserve_ms, out, parked) end
end

