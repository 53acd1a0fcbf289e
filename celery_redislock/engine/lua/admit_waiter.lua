-- A waiting copy of the store's line in an admission: a run with a ticket (ARGV[4],
-- admit_args.lua), whose message exists twice, the copy sent back with a countdown and
-- the express copy re-published when the ticket is handed a slot (line.lua). Put in
-- front of admit_semaphore.lua (admit_slots.lua, admit.lua); only the store's line
-- (redislock_line = "store") asks with a ticket.
--
-- A served ticket remembers which copy was admitted ('d:' .. ticket, line.lua) until it
-- is forgotten ('}:x:'); a served ticket whose other copy is surely still out is also
-- remembered in '}:o:<name>:<ticket>' until that copy comes back, a week at most. A run
-- waiting in a semaphore's line keeps the starts its rate limiters promised it in the
-- line ('p:' .. ticket), so that both copies of its message use one promised start.

-- How long at most a served ticket waits for the other copy of its message (ms).
local OUTSTANDING_COPY_MS = 7 * 24 * 3600 * 1000

-- The key that remembers, for a served ticket, the copy admitted while the other copy of
-- its message is still out (see below), so that it is not forgotten before that copy
-- comes back, however long a stopped worker or a backlog keeps it.
local function outstanding_key(key, ticket)
  return companion(key, 'o') .. ':' .. ticket
end

-- Whether the ticket was served to another copy of this message (the line remembers it,
-- or an outstanding copy was waited for: this is it, and it is not waited for any more).
local function served_by_another(key, ticket, this_copy)
  local served = nil
  if redis.call('ZSCORE', companion(key, 'x'), ticket) then
    served = redis.call('HGET', companion(key, 'w'), 'd:' .. ticket) ~= this_copy
  end
  local outstanding = outstanding_key(key, ticket)
  local admitted = redis.call('HGET', outstanding, 'copy')
  if admitted and admitted ~= this_copy then
    redis.call('HDEL', outstanding, 'copy')  -- the key goes with its only field
    served = true
  end
  return served
end

-- The ticket at semaphore `limiter` (which has a line: `has_line`): the slots handed to
-- it while it waited (limiter.reserved: they are this run's), or whether it waits in
-- the line (limiter.waiting). True when the ticket was served to another copy of the
-- run's message: this copy must not run.
local function waiter_at(limiter, has_line)
  local key, cost = limiter.key, limiter.cost
  if has_line then prune_tickets(key, now) end
  local reserved = redis.call('ZSCORE', key, RESERVED .. ticket)
  if reserved and cost > 1
      and not redis.call('ZSCORE', key, RESERVED .. ticket .. '*' .. cost) then
    drop_reservation(key, ticket, cost)  -- kept for fewer slots than the run now costs
    reserved = false
  end
  if reserved then
    limiter.reserved = true
    return false
  end
  local waiting = redis.call('ZSCORE', companion(key, 'q'), ticket)
  if not waiting and served_by_another(key, ticket, copy) then
    return true  -- served: another copy of the message ran
  end
  limiter.waiting = waiting and true or false
  return false
end

-- Refused by semaphore `key` while waiting in its line: its place in the line; the copy
-- sent back keeps the ticket alive until it comes back.
local function waiter_position(key)
  local position = redis.call('ZRANK', companion(key, 'q'), ticket)
  if not express then
    redis.call('ZADD', companion(key, 'x'), now + keep_ticket, ticket)
    keep_line(key, keep_ticket + STATISTICS_TTL, {'q', 'w', 'x'})
  end
  return position
end

-- Admitted: the ticket is served at semaphore `limiter`: out of the line, and
-- remembered so the other copy does not run too.
local function waiter_served(limiter)
  if limiter.reserved then drop_reservation(limiter.key, ticket, limiter.cost) end
  if not (limiter.reserved or limiter.waiting) then return end
  local xkey = companion(limiter.key, 'x')
  redis.call('ZREM', companion(limiter.key, 'q'), ticket)
  redis.call('HDEL', companion(limiter.key, 'w'), ticket, 'm:' .. ticket, 'c:' .. ticket,
             'p:' .. ticket)
  redis.call('HSET', companion(limiter.key, 'w'), 'd:' .. ticket, copy)
  redis.call('ZADD', xkey, now + keep_ticket, ticket)
  keep_line(limiter.key, keep_ticket + STATISTICS_TTL, {'w', 'x'})
  if express or limiter.reserved then
    -- The other copy is surely still out: the countdown copy, when this is the
    -- express copy; the express copy (sent when the slot was reserved), when this
    -- copy found the slot reserved for it. Waited for until it comes back.
    local outstanding = outstanding_key(limiter.key, ticket)
    redis.call('HSET', outstanding, 'copy', copy)
    redis.call('PEXPIRE', outstanding, OUTSTANDING_COPY_MS)
  end
end

-- A run with a ticket in a semaphore's waiting line keeps the starts it was promised
-- there: 'p:' .. ticket in the line's hash, rate key -> promise (us), whichever copy of
-- its message asked. The other copy is then promised the same start, never a second one.
-- The first semaphore whose line holds the ticket (waiting or handed a slot), or nil,
-- and the starts kept there.
local function waiter_home(limiters)
  local home, kept = nil, {}
  for i = 1, #KEYS do
    local limiter = limiters[i]
    if limiter.kind == 's' and (limiter.reserved or limiter.waiting) then
      home = limiter
      break
    end
  end
  if home then
    local text = redis.call('HGET', companion(home.key, 'w'), 'p:' .. ticket)
    if text then kept = cjson.decode(text) end
  end
  return home, kept
end

-- The run waits in line for its promised start: the slots handed to it stay reserved
-- for it until then (and the ticket is kept), and the promise is kept for its copies.
local function keep_promise(limiters, home, kept, limiter, promise)
  kept[limiter.key] = string.format('%d', promise)
  local wkey = companion(home.key, 'w')
  redis.call('HSET', wkey, 'p:' .. ticket, cjson.encode(kept))
  local until_ms = math.floor(promise / 1000) + math.max(reserve, 1000)
  for i = 1, #KEYS do
    local semaphore = limiters[i]
    if semaphore.kind == 's' and (semaphore.reserved or semaphore.waiting) then
      if reserve > 0 then
        redis.call('ZADD', semaphore.key, 'GT', until_ms, RESERVED .. ticket)
        add_units(semaphore.key, RESERVED .. ticket, semaphore.cost, until_ms, 'GT')
        if redis.call('PTTL', semaphore.key) < until_ms - now + STATISTICS_TTL then
          redis.call('PEXPIRE', semaphore.key, until_ms - now + STATISTICS_TTL)
        end
      end
      redis.call('ZADD', companion(semaphore.key, 'x'), 'GT', until_ms + keep_ticket, ticket)
    end
  end
  keep_line(home.key, until_ms - now + keep_ticket + STATISTICS_TTL, {'w', 'x'})
end
