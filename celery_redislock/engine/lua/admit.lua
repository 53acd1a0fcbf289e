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
--              configured number of slots), once a run has been refused or has
--              joined its line, '#hold' (minus 1 + the average hold time in ms; -0.5
--              until a release since), and '#ttl' (see line.lua: when the key's time
--              to live ends). Only a semaphore with '#hold' can have a waiting line.
--              The key lives at least a minute, and at least until its last lease ends.
--              A run of cost k holds k members (units.lua).
--   rate       hash: 'tat' -> theoretical arrival time (us), GCRA;
--              'line' -> end of the line of promised start times (us);
--              'iv' -> the interval (us) the state is counted in; 'rp' -> the last
--              re-plan, "when(us) factor plan", after the interval changed (the last
--              digit of a promised start (us) is the number of the plan it belongs to);
--              'exp' -> "until tat line": when (ms) the key's time to live, last set
--              here, ends, and the 'tat' and 'line' this script wrote last: the key
--              lives until its state no longer matters (a second after the last start
--              it counts or promised) and at most twice as long, so that most calls
--              need no PEXPIRE. A key whose 'tat' or 'line' someone else wrote since
--              (an earlier version of the package, refund.lua), or without 'exp', gets
--              one: only this script's own writes are known to leave the time to live
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
-- ARGV[10+#KEYS] how far ahead (ms) the caller takes a booked start, or '0': a run whose
--             one limiter is a rate limiter, with no ticket, that would be promised a
--             start within that time (a newcomer, or a run that came back late), or
--             that came back early for a start within that time that is the first the
--             GCRA allows (no start promised before it is due), is admitted from that
--             start instead: the start is counted as taken then,
--             and the caller holds the run until then and starts it without asking
--             again (a worker's main process; it gives the start back with refund.lua
--             if it cannot start the run on time)
-- ARGV[11+#KEYS] the longest lease (ms) the caller's process knows of, if longer than
--             its own: the grace after a loss lasts at least that long (store.lua)
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
--     {2, now, i, promise_us, wait_ms, other, ahead}   rate limiter i refused; the run
--                                is promised a start time (ahead: how many starts come
--                                before it); nothing else is written, except for a run
--                                in a semaphore's waiting line, which keeps its promise
--                                and its reserved slots there; other is 1 when another
--                                copy of the run's message holds this promise
--     {3, now, i, pause_end_ms or -1, 0, 0, 0}   limiter i is paused by an operator
--     {6, now, i, start_us, wait_ms, tat, ahead}   admitted from the booked start start_us
--                                (ARGV[10+#KEYS]): the run is not to start before it;
--                                tat is what the booking wrote (see refund.lua)
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
-- Early means at most EARLY_US before the promised start: a run that asks long before
-- (to hear of a rate raised at run time) takes no start from runs due before it. A run
-- waiting in a semaphore's line keeps its promises in the line, so that both copies of
-- its message (the express one and the one sent back) use one promised start.

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
local book_ms = tonumber(ARGV[10 + #KEYS] or '0') or 0
local bound = math.max(lease, tonumber(ARGV[11 + #KEYS] or '0') or 0)
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

-- A run promised a start is admitted before it only this close to it (us), when the GCRA
-- allows: a run that asks again long before its start (to hear of a rate raised at run
-- time) never takes a start from the runs due before it.
local EARLY_US = 500000

-- Read rate limiter `limiter`'s spec (see ARGV[7+i]) and state, with the operators'
-- interval (us) if one is set.
local function read_rate(limiter, spec, interval_override)
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
  limiter.base = limiter.interval  -- the rate's own interval, whatever this run costs
  cost = tonumber(cost)
  if cost and cost > 1 then
    -- A run that costs N starts: it needs N intervals of room at once, and takes them.
    tolerance = tolerance - (cost - 1) * limiter.interval
    limiter.interval = limiter.interval * cost
  end
  limiter.tolerance = tolerance
  promise = tonumber(promise)
  limiter.no_promise = promise < 0  -- a caller that will not wait: make it no promise
  limiter.promise = limiter.no_promise and 0 or promise
  local saved = redis.call('HMGET', limiter.key, 'tat', 'line', 'iv', 'rp', 'exp')
  limiter.tat = math.max(number(saved[1]), now_us)
  limiter.line = math.max(number(saved[2]), now_us)
  limiter.saved_interval = tonumber(saved[3])
  limiter.replan = saved[4]
  limiter.tat_text, limiter.line_text = saved[1] or '', saved[2] or ''
  local until_ms, tat_text, line_text = string.match(saved[5] or '', '^(%d+) (%S*) (%S*)$')
  limiter.expires = 0  -- unknown: written by someone else since, or never here
  if tat_text == limiter.tat_text and line_text == limiter.line_text then
    limiter.expires = tonumber(until_ms)
  end
end

-- The plan a rate limiter's promises belong to: the last decimal digit of every start
-- it promises (us) is the number of its plan, 0 to 9, which moves on at each re-plan;
-- 'rp' = "when(us) factor plan" records the last re-plan.
local function plan_of(limiter)
  if not limiter.replan then return nil, nil, 0 end
  local at, factor, plan = string.match(limiter.replan, '^(%S+) (%S+) (%S+)$')
  return tonumber(at), tonumber(factor), tonumber(plan) or 0
end

-- A start time as a promise of the current plan: the first time from `start` on (us)
-- whose last digit is the plan's.
local function stamped(limiter, start)
  local _, _, plan = plan_of(limiter)
  local promise = start - start % 10 + plan
  if promise < start then promise = promise + 10 end
  return promise
end

-- Re-plan a rate whose interval changed since its state was written (set-rate,
-- clear-rate, a new configuration): what is owed from now on (the GCRA's 'tat') and the
-- line of promised starts are rescaled to the new interval, about now, so that starts
-- promised under the old rate move to where the new rate puts them; the promises runs
-- still carry are moved when they ask (below).
local function replan(limiter)
  local old = limiter.saved_interval
  if old and old > 0 and old ~= limiter.base then
    local factor = limiter.base / old
    local _, _, plan = plan_of(limiter)
    limiter.tat = now_us + (limiter.tat - now_us) * factor
    limiter.line = math.floor(now_us + (limiter.line - now_us) * factor)
    limiter.replan = string.format('%d %.17g %d', now_us, factor, (plan + 1) % 10)
    limiter.replanned = true
  end
end

-- A start promised under an earlier plan (its last digit is not this plan's), moved to
-- where the last re-plan put it; a promise of this plan, or of a start that had come
-- by the re-plan, as it is. (Moved once: the moved promise is of this plan.)
local function replanned_promise(limiter, promise)
  local at, factor, plan = plan_of(limiter)
  if promise <= 0 or not (at and factor) or promise % 10 == plan or promise <= at then
    return promise
  end
  return stamped(limiter, math.floor(at + (promise - at) * factor))
end

-- The fields of a rate limiter's state to write besides 'tat' / 'line': a re-plan, and
-- the interval the state is counted in.
local function rate_fields(limiter, fields)
  if limiter.replanned then
    fields[#fields + 1] = 'line'
    fields[#fields + 1] = string.format('%d', limiter.line)
    fields[#fields + 1] = 'rp'
    fields[#fields + 1] = limiter.replan
  end
  if limiter.saved_interval ~= limiter.base then
    fields[#fields + 1] = 'iv'
    fields[#fields + 1] = string.format('%.17g', limiter.base)
  end
  return fields
end

-- Phase 1: look at every limiter; stop at the first one that refuses the run.
local limiters = {}
local rate_refusal = nil
local has_rate = false
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
    -- A semaphore with a line has '#hold' (enqueue.lua sees to it, and keeps the
    -- semaphore alive as long as its line): without it, nobody waits, and no more is read.
    limiter.stats = redis.call('ZMSCORE', key, '#fence', '#hold', TTL_END)
    local has_line = limiter.stats[2] and redis.call('EXISTS', companion(key, 'q')) == 1
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
      local grace = grace_of(key, now, now_us, seen, bound)
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
        local hold = limiter.stats[2]
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
    read_rate(limiter, spec, interval_override)
    has_rate = true
  end
  limiters[i] = limiter
end

-- Write a rate limiter's state (`fields`, with 'tat' and/or 'line' among them: `tat`
-- and `line`) and keep the key alive until a second after the last start it counts or
-- promised. The time to live set is twice what that needs, and its end kept in 'exp',
-- with the 'tat' and 'line' written: only a call that finds it too short, or finds
-- that someone else wrote the state since, sets it again (one PEXPIRE in many).
local function write_rate_state(limiter, fields, tat, line)
  local needed = math.ceil((math.max(tat, line) - now_us) / 1000) + 1000
  local extend = limiter.expires < now + needed
  local expires = extend and now + 2 * needed or limiter.expires
  local tat_text, line_text = limiter.tat_text, limiter.line_text
  for i = 1, #fields, 2 do
    if fields[i] == 'tat' then tat_text = fields[i + 1] end
    if fields[i] == 'line' then line_text = fields[i + 1] end
  end
  fields[#fields + 1] = 'exp'
  fields[#fields + 1] = string.format('%d %s %s', expires, tat_text, line_text)
  redis.call('HSET', limiter.key, unpack(fields))
  if extend then redis.call('PEXPIRE', limiter.key, 2 * needed) end
end

-- A run with a ticket in a semaphore's waiting line keeps the starts it was promised
-- there: 'p:' .. ticket in the line's hash, rate key -> promise (us), whichever copy of
-- its message asked. The other copy is then promised the same start, never a second one.
local home = nil  -- the first semaphore whose line holds the ticket (waiting or handed a slot)
local kept = {}
if has_rate and ticket ~= '' then
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
end

-- Phase 1b: every semaphore has a slot for the run; now the rate limiters.
for i = 1, #KEYS do
  local limiter = limiters[i]
  if limiter.kind == 'r' then
    replan(limiter)
    local told = limiter.promise  -- what this copy of the message was promised
    local held = tonumber(kept[limiter.key] or '')
    if held then limiter.promise = held end
    limiter.held = held
    limiter.other_copy = held ~= nil and held ~= told
    local promise = replanned_promise(limiter, limiter.promise)
    limiter.promise = promise
    local allowed_at = limiter.tat - limiter.tolerance
    if promise == 0 then
      allowed_at = math.max(allowed_at, limiter.line - limiter.tolerance)
    elseif limiter.other_copy then
      allowed_at = math.max(allowed_at, promise)  -- the fallback copy is never early
    else
      allowed_at = math.max(allowed_at, promise - EARLY_US)
    end
    if now_us < allowed_at and not rate_refusal then
      rate_refusal = {index = i, limiter = limiter, promise = promise, allowed_at = allowed_at}
    end
  end
end

-- The run waits in line for its promised start: the slots handed to it stay reserved
-- for it until then (and the ticket is kept), and the promise is kept for its copies.
local function keep_promise(limiter, promise)
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
    promise = stamped(limiter, math.floor(math.max(limiter.line, rate_refusal.allowed_at)))
    limiter.line = promise + limiter.interval
  end
  local fresh = promise ~= rate_refusal.promise  -- promised in this call
  -- A run that came back early with its promise books it only if it is the first start
  -- the GCRA allows from now on: a start promised before it would not be due any more,
  -- so booking it takes no other run's start.
  local first_allowed = limiter.tat - limiter.tolerance
  local next_due = promise >= first_allowed and promise <= first_allowed + limiter.interval / 2
  if (fresh or next_due) and book_ms > 0 and #KEYS == 1 and ticket == ''
      and ARGV[9 + #KEYS] ~= '1' and promise - now_us <= book_ms * 1000 then
    -- Booked: admitted from the promised start, which is counted as taken then (as an
    -- admission at that time counts it: the GCRA conforms there, the line starts after).
    local tat = math.max(limiter.tat, promise) + limiter.interval
    local fields = {'tat', string.format('%.0f', tat)}
    if fresh and not limiter.replanned then  -- else the line is among rate_fields, or kept
      fields[3] = 'line'
      fields[4] = string.format('%.0f', limiter.line)
    end
    write_rate_state(limiter, rate_fields(limiter, fields), tat, limiter.line)
    return reply(6, rate_refusal.index, promise, math.ceil((promise - now_us) / 1000), tat,
                 math.max(0, math.floor((promise - now_us) / limiter.interval)))
  end
  if fresh or limiter.replanned or limiter.saved_interval ~= limiter.base then
    local fields = {'line', string.format('%.0f', limiter.line)}
    if limiter.replanned then
      fields = {'tat', string.format('%.0f', limiter.tat)}  -- the line is among rate_fields
    end
    write_rate_state(limiter, rate_fields(limiter, fields), limiter.tat, limiter.line)
  end
  if home and promise ~= limiter.held then keep_promise(limiter, promise) end
  -- Another copy of the run's message holds this promise: this one is told so (it
  -- comes back after that start, in case that copy never does).
  local other = (limiter.other_copy and promise == limiter.held) and 1 or 0
  local ahead = math.max(0, math.floor((promise - now_us) / limiter.interval))
  return reply(2, rate_refusal.index, promise, math.ceil((promise - now_us) / 1000),
               other, ahead)
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
    local stats = limiter.stats
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
  else
    local tat = limiter.tat + limiter.interval
    write_rate_state(limiter, rate_fields(limiter, {'tat', string.format('%.0f', tat)}), tat,
                     limiter.line)
  end
end
if #handed > 0 then return reply(1, 0, lease_end, fence_text, contended, last) end
return string.format('%s %s %s %d %d', now_text, lease_end_text, fence_text, contended, last)
