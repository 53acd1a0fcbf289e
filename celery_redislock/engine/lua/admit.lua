-- Admit one run past N limiters at once, all or nothing, on the server's clock.
-- (line.lua, the waiting line, and units.lua, weighted holders, are put in front of this
-- script when it is loaded.)
--
-- A limiter is a leased semaphore ('s') or a rate limiter ('r'), one key each:
--
--   semaphore  sorted set. Each holder is a member "token acquired_ms fence description"
--              scored by the end of its lease (ms). Reservations '~ticket' (line.lua)
--              count as holders. Members with negative scores keep statistics and never
--              count: '#fence' (minus the last fencing number), '#slots' (minus the
--              configured number of slots) and, once a run has been refused, '#hold'
--              (minus 1 + the average hold time in ms; -0.5 until a release since).
--              The key lives at least a minute, and at least until its last lease ends.
--              A run of cost k holds k members (units.lua).
--   rate       hash: 'tat' -> theoretical arrival time (us), GCRA;
--              'line' -> end of the line of promised start times (us)
--
-- KEYS[i]     the key of limiter i
-- ARGV[1]     holder token, unique per acquisition
-- ARGV[2]     lease length (ms)
-- ARGV[3]     holder description (opaque text for operators)
-- ARGV[4]     the run's ticket in a waiting line, or '' (see line.lua)
-- ARGV[5]     which copy of the run's message this is: 'e:<id>' for an express copy,
--             sent when the ticket was handed a slot, 'o:<id>' for a copy sent back with
--             a countdown, '' without a ticket. A served ticket remembers the copy that
--             was admitted: the same message delivered again (its run's worker died and
--             the broker redelivered it) is not turned away as "served"
-- ARGV[6]     how long a served ticket is remembered (ms)
-- ARGV[7]     how long a slot handed to a waiter stays reserved for it (ms); 0 for a
--             caller that cannot re-publish a waiter's message
-- ARGV[7+i]   limiter i: 's:<slots>' or 'r:<interval us>:<tolerance us>:<promise>'
--             (either followed by ':<cost>' for a run that takes <cost> slots, or uses
--             <cost> starts, at once), the
--             promise being the start time (us) promised earlier, 0 for none, or -1 for
--             a caller that will not wait (refused, it is told when to try, promised
--             nothing)
-- ARGV[8+#KEYS]  the latest incarnation of the store the caller saw (its 'born', or a
--             fencing number it was given; 0 if none; -1 on Redis Cluster; see
--             store.lua): a semaphore refuses (status 0) during the grace that follows
--             a loss of the store's data
-- ARGV[9+#KEYS]  '1' for a probe: refused, the run is refused as always (and what a
--             refusal writes is written: a rate limiter's promise, a line's memory);
--             admitted by every limiter, nothing is taken and the reply is {5, now, 0,
--             0, 0, 0, 0} (a worker's main process asks so when no pool process is free)
--
-- Replies:
--   "now_ms lease_end_ms fence contended last"   admitted, nothing else to do. The
--                                           holder's entry in every semaphore is "token
--                                           now_ms fence description" (fence 0 without
--                                           one); contended is 1 if a semaphore has a
--                                           line or keeps an average hold time; last is
--                                           1 if the run took the last free slot of a
--                                           semaphore (whoever asks next waits for it)
--   {status, now_ms, i, a, b, c, d, message...}   where the messages are those of waiters
--   that were handed a slot on the way and must be re-published by the caller:
--     {1, now, 0, lease_end, fence, contended, last}   admitted
--     {0, now, i, holders, ms_until_first_lease_end, average_hold_ms, position}
--                                semaphore i is full (or its slots are promised to the
--                                line); position: the ticket's place in the line, or -1
--     {2, now, i, promise_us, wait_ms, 0, 0}   rate limiter i refused; the run is promised
--                                a start time, and nothing else is written
--     {3, now, i, pause_end_ms or -1, 0, 0, 0}   limiter i is paused by an operator
--     {4, now, i, 0, 0, 0, 0}    the ticket was served already: this copy must not run
--                                (a served ticket whose other copy was surely still
--                                out is remembered until that copy comes back, a week
--                                at most, in the hash '}:o:<name>:<ticket>')
--
-- A newcomer (no promise) is admitted by a rate limiter only when no promised start is
-- still ahead of it, so waiters are served in the order they were promised. A run that
-- comes back with a promise is admitted when the GCRA allows (early, it may take a start
-- left free by a late run); early and refused, it keeps its promise; at or after its
-- promised time and refused (runs that came early took the free starts), it is promised
-- the start at the end of the line, as a newcomer is: a start is promised to one run only.

local token = ARGV[1]
local lease = tonumber(ARGV[2])
local description = ARGV[3]
local ticket = ARGV[4]
local copy = ARGV[5]
local express = string.sub(copy, 1, 1) == 'e'
local keep_ticket = tonumber(ARGV[6])
local reserve = tonumber(ARGV[7])
local STATISTICS_TTL = 60000
-- How long at most a served ticket waits for the other copy of its message (ms).
local OUTSTANDING_COPY_MS = 7 * 24 * 3600 * 1000
local seen = tonumber(ARGV[8 + #KEYS] or '0') or 0
local now, now_us = server_now()
-- Numbers go to Redis and into the reply as text made here with '%d': Lua's own number
-- to text conversion (and '%.0f') takes the C library's slow floating-point path.
local now_text = string.format('%d', now)
local handed = {}

local function number(value)
  return tonumber(value or '0') or 0
end

local function reply(status, i, a, b, c, d)
  local answer = {status, now, i, a, b, c, d}
  for _, message in ipairs(handed) do answer[#answer + 1] = message end
  return answer
end

-- The operators' control hash of a rate limiter: its pause, and the interval (us) of a
-- rate set at run time ('set-rate'), which replaces the configured one (the burst, in
-- intervals, stays the task's).
local function rate_control(key)
  local control = string.gsub(key, '}:r:', '}:cr:', 1)
  local fields = redis.call('HMGET', control, 'paused_until', 'interval')
  return pause_end(fields[1], now), tonumber(fields[2])
end

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

-- Phase 1: look at every limiter; stop at the first one that refuses the run.
local limiters = {}
local rate_refusal = nil
for i = 1, #KEYS do
  local key = KEYS[i]
  local spec = ARGV[7 + i]
  local limiter = {kind = string.sub(spec, 1, 1), key = key}
  if limiter.kind == 's' then
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
    if paused then return reply(3, i, paused, 0, 0, 0) end
    -- Leases and reservations that ran out are dropped first: an admission always
    -- replaces them, so a late release of one of them says it no longer held its slot.
    redis.call('ZREMRANGEBYSCORE', key, '0', now_text)
    local has_line = redis.call('EXISTS', companion(key, 'q')) == 1
    limiter.has_line = has_line
    if ticket ~= '' and has_line then prune_tickets(key, now) end
    local reserved = ticket ~= '' and redis.call('ZSCORE', key, RESERVED .. ticket)
    if reserved and cost > 1
        and not redis.call('ZSCORE', key, RESERVED .. ticket .. '*' .. cost) then
      drop_reservation(key, ticket, cost)  -- kept for fewer slots than the run now costs
      reserved = false
    end
    if reserved then
      limiter.reserved = true  -- handed its slots while it waited: they are this run's
    else
      local waiting = ticket ~= '' and redis.call('ZSCORE', companion(key, 'q'), ticket)
      if ticket ~= '' and not waiting and served_by_another(key, ticket, copy) then
        return reply(4, i, 0, 0, 0, 0)  -- served: another copy of the message ran
      end
      limiter.waiting = waiting and true or false
      local used = redis.call('ZCOUNT', key, '(' .. now_text, '+inf')
      local free = slots - used
      -- After a loss of the store's data, no slot is granted until the grace ends.
      local grace = grace_of(key, now, now_us, seen, lease)
      local blocked = free < cost or grace ~= nil
      if not blocked and has_line then
        -- Free slots go to the line first, oldest first; the run gets its slots only if
        -- enough are left when its own turn (or the end of the line) comes.
        local reached
        free, reached, blocked = hand_over(key, free, now, reserve, ticket, handed, slots)
        blocked = blocked or free < cost
      end
      limiter.last = free <= cost
      if blocked then
        local first = redis.call('ZRANGEBYSCORE', key, '(' .. now_text, '+inf', 'WITHSCORES',
                                 'LIMIT', 0, 1)
        local until_first_end = 0
        if first[2] then until_first_end = tonumber(first[2]) - now end
        if grace then until_first_end = math.max(until_first_end, grace - now) end
        local hold = redis.call('ZSCORE', key, '#hold')
        if hold then
          hold = -tonumber(hold) - 1
        else
          redis.call('ZADD', key, -0.5, '#hold')  -- contended: releases keep the average
        end
        local position = -1
        if waiting then
          position = redis.call('ZRANK', companion(key, 'q'), ticket)
          if not express then
            redis.call('ZADD', companion(key, 'x'), now + keep_ticket, ticket)
            keep_line(key, keep_ticket + STATISTICS_TTL, {'q', 'w', 'x'})
          end
        end
        return reply(0, i, used, until_first_end, hold and hold >= 0 and hold or -1,
                     position)
      end
    end
  else
    local paused, interval_override = rate_control(key)
    if paused then return reply(3, i, paused, 0, 0, 0) end
    local interval, tolerance, promise, cost = string.match(spec,
      '^r:([^:]+):([^:]+):([^:]+):?(%d*)$')
    limiter.interval = tonumber(interval)
    tolerance = tonumber(tolerance)
    if interval_override and interval_override > 0 then
      if limiter.interval > 0 then
        tolerance = tolerance / limiter.interval * interval_override
      end
      limiter.interval = interval_override
    end
    cost = tonumber(cost)
    if cost and cost > 1 then
      -- A run that costs N starts: it needs N intervals of room at once, and takes them.
      tolerance = tolerance - (cost - 1) * limiter.interval
      limiter.interval = limiter.interval * cost
    end
    promise = tonumber(promise)
    limiter.no_promise = promise < 0  -- a caller that will not wait: make it no promise
    if limiter.no_promise then promise = 0 end
    local saved = redis.call('HMGET', key, 'tat', 'line')
    limiter.tat = math.max(number(saved[1]), now_us)
    limiter.line = math.max(number(saved[2]), now_us)
    local allowed_at = limiter.tat - tolerance
    if promise == 0 then allowed_at = math.max(allowed_at, limiter.line - tolerance) end
    if now_us < allowed_at and not rate_refusal then
      rate_refusal = {index = i, limiter = limiter, promise = promise, allowed_at = allowed_at}
    end
  end
  limiters[i] = limiter
end

local function expire_rate_state(limiter, tat, line)
  redis.call('PEXPIRE', limiter.key, math.ceil((math.max(tat, line) - now_us) / 1000) + 1000)
end

-- Refused by a rate limiter: keep an early run's promise, else promise a start time.
if rate_refusal then
  local limiter = rate_refusal.limiter
  local promise = rate_refusal.promise
  if limiter.no_promise then
    return reply(2, rate_refusal.index, rate_refusal.allowed_at,
                 math.ceil((rate_refusal.allowed_at - now_us) / 1000), 0, 0)
  elseif promise == 0 or now_us >= promise then
    -- A newcomer, or a run that came back late and found its start taken by one that
    -- came early: the next start time at the end of the line, which is nobody else's
    -- (each start is promised to one run only, so no two runs contend for one start).
    promise = math.max(limiter.line, rate_refusal.allowed_at)
    limiter.line = promise + limiter.interval
  end
  if promise ~= rate_refusal.promise then
    redis.call('HSET', limiter.key, 'line', string.format('%.0f', limiter.line))
    expire_rate_state(limiter, limiter.tat, limiter.line)
  end
  return reply(2, rate_refusal.index, promise, math.ceil((promise - now_us) / 1000), 0, 0)
end

if ARGV[9 + #KEYS] == '1' then return reply(5, 0, 0, 0, 0, 0) end  -- a probe

-- Phase 2: admitted by every limiter. One fencing number for the whole admission, above
-- the last one of every semaphore (and the server's time in microseconds, so it keeps
-- rising after an idle semaphore was deleted).
local fence = 0
local has_semaphore = false
local contended = 0
local last = 0
for i = 1, #KEYS do
  local limiter = limiters[i]
  if limiter.kind == 's' then
    has_semaphore = true
    local stats = redis.call('ZMSCORE', limiter.key, '#fence', '#hold')
    fence = math.max(fence, stats[1] and (1 - tonumber(stats[1])) or 0)
    if stats[2] or limiter.has_line then contended = 1 end
    if limiter.last then last = 1 end
  end
end
if has_semaphore then fence = math.max(fence, now_us) end
local fence_text = string.format('%d', fence)
local lease_end = now + lease
local lease_end_text = string.format('%d', lease_end)
local member = token .. ' ' .. now_text .. ' ' .. fence_text .. ' ' .. description

for i = 1, #KEYS do
  local limiter = limiters[i]
  if limiter.kind == 's' then
    if limiter.reserved then drop_reservation(limiter.key, ticket, limiter.cost) end
    if limiter.reserved or limiter.waiting then
      -- Served: out of the line, and remembered so the other copy does not run too.
      local xkey = companion(limiter.key, 'x')
      redis.call('ZREM', companion(limiter.key, 'q'), ticket)
      redis.call('HDEL', companion(limiter.key, 'w'), ticket, 'm:' .. ticket, 'c:' .. ticket)
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
    redis.call('ZADD', limiter.key, lease_end_text, member, '-' .. fence_text, '#fence',
               limiter.minus_slots, '#slots')
    add_units(limiter.key, token, limiter.cost, lease_end_text)
    if redis.call('PTTL', limiter.key) < lease then
      redis.call('PEXPIRE', limiter.key, math.max(lease, STATISTICS_TTL))
    end
  else
    local tat = limiter.tat + limiter.interval
    redis.call('HSET', limiter.key, 'tat', string.format('%.0f', tat))
    expire_rate_state(limiter, tat, limiter.line)
  end
end
if #handed > 0 then return reply(1, 0, lease_end, fence_text, contended, last) end
return string.format('%s %s %s %d %d', now_text, lease_end_text, fence_text, contended, last)
