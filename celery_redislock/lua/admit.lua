-- Admit one run past N limiters at once, all or nothing, on the server's clock.
--
-- A limiter is either a leased semaphore ('s', two keys) or a rate limiter ('r', one key).
--
--   semaphore  holders  sorted set: member = holder token, score = end of its lease (ms)
--              details  hash: holder token -> "acquired_ms|fence|description",
--                       '#fence' -> last fencing number, '#hold' -> average hold time (ms)
--   rate       state    hash: 'tat' -> theoretical arrival time (us), GCRA;
--                       'line' -> end of the line of promised start times (us)
--
-- ARGV[1] holder token, unique per acquisition     ARGV[2] lease length (ms)
-- ARGV[3] holder description (opaque text)          ARGV[4] N, the number of limiters
-- then four values per limiter i, from ARGV[5 + 4 * (i - 1)]:
--   's', slots, -, -
--   'r', interval (us), tolerance (us), promise (us; 0 for none)
-- KEYS: each limiter's keys in order (two for 's', one for 'r').
--
-- Replies:
--   {1, now_ms, lease_end_ms, fence_1, ..., fence_N}   admitted (fence 0 for rate limiters)
--   {0, now_ms, i, holders, ms_until_first_lease_end, average_hold_ms}
--                                                      semaphore i is full; nothing written
--   {2, now_ms, i, promise_us, wait_ms}                rate limiter i refused; the run is
--                                                      promised a start time (kept in the
--                                                      line) and nothing else is written
--
-- A newcomer (no promise) is admitted by a rate limiter only when no promised start is
-- still ahead of it, so waiters are served in the order they were promised. A run that
-- comes back with a promise is admitted when the GCRA allows; early, it keeps its promise;
-- at or after its promised time but overtaken, it is promised again at the end of the line.
--
-- Repeating a call with a token that already holds the semaphores takes no second slot.

local token = ARGV[1]
local lease = tonumber(ARGV[2])
local description = ARGV[3]
local count = tonumber(ARGV[4])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function drop_expired(holders, details)
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  if #expired == 0 then return end
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  for first = 1, #expired, 1000 do
    redis.call('HDEL', details, unpack(expired, first, math.min(first + 999, #expired)))
  end
end

local function number(value)
  return tonumber(value or '0') or 0
end

-- Phase 1: look at every limiter; stop at the first semaphore that is full.
local limiters = {}
local rate_refusal = nil
local key_index = 1
for i = 1, count do
  local base = 5 + 4 * (i - 1)
  local kind = ARGV[base]
  local limiter = {kind = kind}
  if kind == 's' then
    limiter.holders, limiter.details = KEYS[key_index], KEYS[key_index + 1]
    key_index = key_index + 2
    local slots = tonumber(ARGV[base + 1])
    -- Fast path: room even counting expired leases. Expired ones are dropped only when
    -- the semaphore looks full, since only then do they change the answer.
    if redis.call('ZCARD', limiter.holders) >= slots
        and not redis.call('ZSCORE', limiter.holders, token) then
      drop_expired(limiter.holders, limiter.details)
      local used = redis.call('ZCARD', limiter.holders)
      if used >= slots then
        local first = redis.call('ZRANGE', limiter.holders, 0, 0, 'WITHSCORES')
        local until_first_end = 0
        if first[2] then until_first_end = tonumber(first[2]) - now end
        local hold = tonumber(redis.call('HGET', limiter.details, '#hold') or '-1')
        return {0, now, i, used, until_first_end, hold}
      end
    end
  else
    limiter.state = KEYS[key_index]
    key_index = key_index + 1
    limiter.interval = tonumber(ARGV[base + 1])
    local tolerance = tonumber(ARGV[base + 2])
    local promise = tonumber(ARGV[base + 3])
    local saved = redis.call('HMGET', limiter.state, 'tat', 'line')
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
  local ttl = math.ceil((math.max(tat, line) - now_us) / 1000) + 1000
  redis.call('PEXPIRE', limiter.state, ttl)
end

-- Refused by a rate limiter: keep an early run's promise, else promise a start time.
if rate_refusal then
  local limiter = rate_refusal.limiter
  local promise = rate_refusal.promise
  if promise == 0 or now_us >= promise then
    promise = math.max(limiter.line, rate_refusal.allowed_at)
    limiter.line = promise + limiter.interval
    redis.call('HSET', limiter.state, 'line', string.format('%.0f', limiter.line))
    expire_rate_state(limiter, limiter.tat, limiter.line)
  end
  return {2, now, rate_refusal.index, promise, math.ceil((promise - now_us) / 1000)}
end

-- Phase 2: admitted by every limiter; take the slots and spend the rate.
local lease_end = now + lease
local reply = {1, now, lease_end}
for i = 1, count do
  local limiter = limiters[i]
  local fence = 0
  if limiter.kind == 's' then
    fence = now_us
    local last = tonumber(redis.call('HGET', limiter.details, '#fence') or '0')
    if last >= fence then fence = last + 1 end
    local fence_text = string.format('%.0f', fence)
    redis.call('ZADD', limiter.holders, lease_end, token)
    redis.call('HSET', limiter.details, token, now .. '|' .. fence_text .. '|' .. description,
               '#fence', fence_text)
    if redis.call('PTTL', limiter.holders) < lease then
      redis.call('PEXPIRE', limiter.holders, lease)
      redis.call('PEXPIRE', limiter.details, lease)
    end
  else
    local tat = limiter.tat + limiter.interval
    redis.call('HSET', limiter.state, 'tat', string.format('%.0f', tat))
    expire_rate_state(limiter, tat, limiter.line)
  end
  reply[#reply + 1] = fence
end
return reply
