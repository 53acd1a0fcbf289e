-- Rate limiters in an admission (admit_rate.lua, admit.lua; after admit_args.lua).
--
-- A rate limiter is a hash: 'tat' -> theoretical arrival time (us), GCRA; 'line' -> end
-- of the line of promised start times (us); 'iv' -> the interval (us) the state is
-- counted in; 'rp' -> the last re-plan, "when(us) factor plan", after the interval
-- changed (the last digit of a promised start (us) is the number of its plan); 'exp' ->
-- "until tat line": when (ms) the key's time to live, last set here, ends, and the 'tat'
-- and 'line' this script wrote last: the key lives until its state no longer matters (a
-- second after the last start it counts or promised) and at most twice as long, so that
-- most calls need no PEXPIRE. A key whose 'tat' or 'line' someone else wrote since
-- (refund.lua), or without 'exp', gets one: only this script's own writes are known to
-- leave the time to live.
--
-- A newcomer (no promise) is admitted only when no promised start is still ahead of it,
-- so waiters are served in the order they were promised. A run that comes back with a
-- promise is admitted when the GCRA allows (early, it may take a start left free by a
-- late run); early and refused, it keeps its promise; at or after its promised time and
-- refused (runs that came early took the free starts), it is promised the start at the
-- end of the line, as a newcomer is: a start is promised to one run only. Early means at
-- most EARLY_US before the promised start.

-- The operators' control hash of a rate limiter: its pause, and the interval (us) of a
-- rate set at run time ('set-rate'), which replaces the configured one (the burst, in
-- intervals, stays the task's).
local function rate_control(key)
  local control = string.gsub(key, '}:r:', '}:cr:', 1)
  local fields = redis.call('HMGET', control, 'paused_until', 'interval')
  return pause_end(fields[1], now), tonumber(fields[2])
end

-- A run promised a start is admitted before it only this close to it (us), when the GCRA
-- allows: a run that asks again long before its start (to hear of a rate raised at run
-- time) never takes a start from the runs due before it.
local EARLY_US = 500000

-- Read rate limiter `limiter`'s spec (see ARGV[3+i]) and state, with the operators'
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

-- Admitted by every limiter: the run's start is counted.
local function take_start(limiter)
  local tat = limiter.tat + limiter.interval
  write_rate_state(limiter, rate_fields(limiter, {'tat', string.format('%.0f', tat)}), tat,
                   limiter.line)
end

-- Read rate limiter i (`key`, its spec ARGV[3+i]): the limiter, or nil and the reply
-- that refuses the run (paused by an operator).
local function read_rate_limiter(i, key, spec)
  local limiter = {kind = 'r', key = key}
  local paused, interval_override = rate_control(key)
  if paused then return nil, reply(3, i, paused, 0, 0, 0) end
  read_rate(limiter, spec, interval_override)
  return limiter
end

-- Whether rate limiter i allows the run now (the semaphores have a slot for it); else
-- its refusal.
local function rate_check(i, limiter)
  replan(limiter)
  local promise = replanned_promise(limiter, limiter.promise)
  limiter.promise = promise
  local allowed_at = limiter.tat - limiter.tolerance
  if promise == 0 then
    allowed_at = math.max(allowed_at, limiter.line - limiter.tolerance)
  else
    allowed_at = math.max(allowed_at, promise - EARLY_US)
  end
  if now_us < allowed_at then
    return {index = i, limiter = limiter, promise = promise, allowed_at = allowed_at}
  end
  return nil
end

-- Refused by a rate limiter: keep an early run's promise, else promise a start time.
local function rate_refused(rate_refusal)
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
  if (fresh or next_due) and book_ms > 0 and #KEYS == 1
      and not probe and promise - now_us <= book_ms * 1000 then
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
  local ahead = math.max(0, math.floor((promise - now_us) / limiter.interval))
  return reply(2, rate_refusal.index, promise, math.ceil((promise - now_us) / 1000), 0,
               ahead)
end
