-- Admit one run past N limiters at once, all or nothing, on the server's clock.
--
-- A limiter is a leased semaphore ('s') or a rate limiter ('r'), one key each:
--
--   semaphore  sorted set. Each holder is a member "token acquired_ms fence description"
--              scored by the end of its lease (ms). Two members keep statistics, with
--              negative scores so they never count as holders: '#fence' (minus the last
--              fencing number) and, once a run has been refused, '#hold' (minus 1 + the
--              average hold time in ms; -0.5 until a holder has been released since).
--              The key lives at least a minute, and at least until its last lease ends.
--   rate       hash: 'tat' -> theoretical arrival time (us), GCRA;
--              'line' -> end of the line of promised start times (us)
--
-- KEYS[i]     the key of limiter i
-- ARGV[1]     holder token, unique per acquisition
-- ARGV[2]     lease length (ms)
-- ARGV[3]     holder description (opaque text for operators)
-- ARGV[3+i]   limiter i: 's:<slots>' or 'r:<interval us>:<tolerance us>:<promise>', the
--             promise being the start time (us) promised earlier, 0 for none, or -1 for
--             a caller that will not wait (refused, it is told when to try, promised
--             nothing)
--
-- Replies:
--   "now_ms lease_end_ms fence contended"      (one string: cheap to send and parse)
--                                              admitted; the holder's entry in every
--                                              semaphore is "token now_ms fence description"
--                                              (fence 0 without a semaphore); contended is 1
--                                              if a semaphore keeps an average hold time,
--                                              which release.lua must then update
--   {0, now_ms, i, holders, ms_until_first_lease_end, average_hold_ms}
--                                              semaphore i is full; nothing is taken
--   {2, now_ms, i, promise_us, wait_ms}        rate limiter i refused; the run is promised
--                                              a start time, and nothing else is written
--
-- A newcomer (no promise) is admitted by a rate limiter only when no promised start is
-- still ahead of it, so waiters are served in the order they were promised. A run that
-- comes back with a promise is admitted when the GCRA allows; early, it keeps its promise;
-- at or after its promised time but overtaken (another promised run came late and took
-- its start), it is promised the next start and the end of the line moves back by one.

local token = ARGV[1]
local lease = tonumber(ARGV[2])
local description = ARGV[3]
local STATISTICS_TTL = 60000
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function number(value)
  return tonumber(value or '0') or 0
end

-- Phase 1: look at every limiter; stop at the first semaphore that is full.
local limiters = {}
local rate_refusal = nil
for i = 1, #KEYS do
  local key = KEYS[i]
  local spec = ARGV[3 + i]
  local limiter = {kind = string.sub(spec, 1, 1), key = key}
  if limiter.kind == 's' then
    local slots = tonumber(string.sub(spec, 3))
    -- Leases that ran out are dropped first: an admission always replaces them, so a
    -- late release of one of them says it no longer held its slot.
    redis.call('ZREMRANGEBYSCORE', key, 0, now)
    local used = redis.call('ZCOUNT', key, '(' .. now, '+inf')
    if used >= slots then
      local first = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES',
                               'LIMIT', 0, 1)
      local until_first_end = 0
      if first[2] then until_first_end = tonumber(first[2]) - now end
      local hold = redis.call('ZSCORE', key, '#hold')
      if hold then
        hold = -tonumber(hold) - 1
      else
        redis.call('ZADD', key, -0.5, '#hold')  -- contended: releases now keep the average
      end
      return {0, now, i, used, until_first_end, hold and hold >= 0 and hold or -1}
    end
  else
    local interval, tolerance, promise = string.match(spec, '^r:([^:]+):([^:]+):([^:]+)$')
    limiter.interval = tonumber(interval)
    tolerance = tonumber(tolerance)
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
    return {2, now, rate_refusal.index, rate_refusal.allowed_at,
            math.ceil((rate_refusal.allowed_at - now_us) / 1000)}
  elseif promise == 0 then
    -- A newcomer: the next start time at the end of the line.
    promise = math.max(limiter.line, rate_refusal.allowed_at)
    limiter.line = promise + limiter.interval
  elseif now_us >= promise then
    -- Came back on time (or late) but another run took the start: it keeps its place at
    -- the front, the next start time, and the line moves back by one to make room.
    promise = rate_refusal.allowed_at
    limiter.line = limiter.line + limiter.interval
  end
  if promise ~= rate_refusal.promise then
    redis.call('HSET', limiter.key, 'line', string.format('%.0f', limiter.line))
    expire_rate_state(limiter, limiter.tat, limiter.line)
  end
  return {2, now, rate_refusal.index, promise, math.ceil((promise - now_us) / 1000)}
end

-- Phase 2: admitted by every limiter. One fencing number for the whole admission, above
-- the last one of every semaphore (and the server's time in microseconds, so it keeps
-- rising after an idle semaphore was deleted).
local fence = 0
local has_semaphore = false
local contended = 0
for i = 1, #KEYS do
  if limiters[i].kind == 's' then
    has_semaphore = true
    local stats = redis.call('ZMSCORE', limiters[i].key, '#fence', '#hold')
    fence = math.max(fence, stats[1] and (1 - tonumber(stats[1])) or 0)
    if stats[2] then contended = 1 end
  end
end
if has_semaphore then fence = math.max(fence, now_us) end
local fence_text = string.format('%.0f', fence)
local lease_end = now + lease
local member = token .. ' ' .. string.format('%.0f', now) .. ' ' .. fence_text .. ' '
  .. description

for i = 1, #KEYS do
  local limiter = limiters[i]
  if limiter.kind == 's' then
    redis.call('ZADD', limiter.key, lease_end, member, -fence, '#fence')
    if redis.call('PTTL', limiter.key) < lease then
      redis.call('PEXPIRE', limiter.key, math.max(lease, STATISTICS_TTL))
    end
  else
    local tat = limiter.tat + limiter.interval
    redis.call('HSET', limiter.key, 'tat', string.format('%.0f', tat))
    expire_rate_state(limiter, tat, limiter.line)
  end
end
return string.format('%.0f %.0f %.0f %d', now, lease_end, fence, contended)
