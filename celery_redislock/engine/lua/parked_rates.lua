-- Rate limits in an admission on the parked line (admit_parked.lua, after parked_admit.lua):
-- a run of semaphores and rate limits, of several rate limits, or of a rate of cost > 1 is
-- decided all or nothing across every limit in ONE script, on the server's clock. The rate
-- keys are rate_parked.lua's (its FIFO of promised starts 'pq', references 'pr', counts
-- 'pn'; the poll is due_rate.lua).
--
-- The semaphores decide first (admit_parked.lua as ever); admitted by them, the rates
-- decide. Rate R allows the run when its GCRA does (a cost of c needs c intervals of room
-- at once and takes them: admit.lua's rule) and, for a run with no turn, no promised start
-- is ahead of it (R's 'line'). Every rate allows: admitted, one start counted in every
-- rate's 'tat', its rate reference served. Else the run parks at the rate whose start is
-- latest, S (the greatest over the rates: max(line, tat - tolerance)): S goes on that
-- key's FIFO and EVERY rate's line moves past S (the start is the run's at each rate),
-- and a semaphore reservation the copy took is given back and handed over at once, its
-- semaphore reference dropped: the run waits in one line, as one message.
-- A copy moved from a rate line (its reference there names its park id) has its turn: it
-- asks the semaphores as a newcomer; refused there, it parks at the semaphore and keeps
-- its turn: its rate reference becomes 't since park_id promise'. A copy with a turn needs
-- only each rate's GCRA (its start is reserved in every line: it is given no new one at
-- the end); refused (moved up to the poll's lead early, or others took the room), it parks
-- again at the HEAD of the binding rate's FIFO with the GCRA's start. A paused rate parks
-- the run with no promise ('p', as rate_parked.lua; promised a start once the pause ends).
-- A run's max wait is kept at the rate it parks at, as at a semaphore (rate_late).
--
-- KEYS: after the semaphores and the index of parked lines: rate key j (1..R), then the
-- index of rate keys with a parked line. A rate key is named '...}:r:...'.
-- ARGV[11+3N+3j .. 13+3N+3j]: rate j's interval (us), tolerance (us: burst x interval),
-- cost (every optional argument of admit_parked.lua before them is then sent).
-- A park at rate j answers {7, now, N + j, 0, wait_ms (-1: paused for ever), -1, park_id}.

-- Read the R rate keys from KEYS[first] (their ARGV from `arg`) for `run`, this copy's
-- id `copy` ('' for none). A reference served to this very copy (its reply lost, or
-- given back unacknowledged) is a rerun's: the copy asks as a newcomer, and the reference is
-- served again once it is admitted, or dropped once it parks (keep_turn, rates_park).
local function read_rates(first, count, arg, run, now, now_us, copy)
  local rates = {}
  for j = 1, count do
    local key, a = KEYS[first + j - 1], arg + 3 * (j - 1)
    local interval, tolerance = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    local cost = tonumber(ARGV[a + 2]) or 1
    local control = redis.call('HMGET', (string.gsub(key, '}:r:', '}:cr:', 1)),
                               'paused_until', 'interval')
    local override = tonumber(control[2] or '')
    if override and override > 0 then
      if interval > 0 then tolerance = tolerance / interval * override end
      interval = override
    end
    local r = {key = key, base = interval, paused = pause_end(control[1], now)}
    r.interval, r.tolerance = interval * cost, tolerance - (cost - 1) * interval
    replan_rate(key, interval, now_us)  -- a rate changed at run time (rate_plan.lua)
    local saved = redis.call('HMGET', key, 'tat', 'line')
    r.tat = math.max(tonumber(saved[1] or '0') or 0, now_us)
    r.line = math.max(tonumber(saved[2] or '0') or 0, now_us)
    prune_served(key, now)
    r.ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
    r.rerun = r.ref and r.ref.state == 's' and copy ~= '' and r.ref.copy == copy
    rates[j] = r
  end
  return rates
end

-- The copy's turn: 'stale' (served, or a copy of rate `home_j` its reference does not
-- name waiting), true (moved from the rate line, or kept its turn at a semaphore), false.
local function rate_turn(rates, home_j, park_id)
  local turn = false
  for j, r in ipairs(rates) do
    local ref = not r.rerun and r.ref
    if ref and ref.state == 's' then return 'stale' end
    if j == home_j then
      if ref and (ref.state ~= 'w' or ref.park_id ~= park_id) then return 'stale' end
      if ref then turn = true end
    elseif ref and ref.state == 't' then
      turn = true
    end
  end
  return turn
end

-- The start (us) the rates allow the run: now when every one does (returns now, 0), else
-- the latest of their starts and the rate j that sets it (math.huge for a paused rate).
local function rates_start(rates, turn, now_us)
  local ready, start, at = true, now_us, 0
  for j, r in ipairs(rates) do
    if r.paused then return math.huge, j end
    local allowed, promise = r.tat - r.tolerance, r.tat - r.tolerance
    if not turn then
      allowed = math.max(allowed, r.line - r.tolerance)
      promise = math.max(promise, r.line)
    end
    if allowed > now_us then ready = false end
    if promise > start then start, at = promise, j end
  end
  if ready then return now_us, 0 end
  return math.floor(start), at
end

-- Write rate `r`'s state and keep it a second past the last start it counts or promised.
local function write_rate(r, fields, now_us)
  redis.call('HSET', r.key, unpack(fields))
  local needed = math.ceil((math.max(r.tat, r.line) - now_us) / 1000) + 1000
  if redis.call('PTTL', r.key) < needed then
    redis.call('PEXPIRE', r.key, math.max(2 * needed, 60000))
  end
end

-- Rate `r`'s reference of `run` is served (kept `keep` ms): a copy that comes later ends
-- (but copy `copy`, acking late).
local function serve_rate(r, run, keep, now, copy)
  drop_deadline(r.key, run)
  write_ref(r.key, run, 's', r.ref.since ~= '' and r.ref.since or '0', '', '', '', copy)
  local served = parked_key(r.key, 'px')
  redis.call('RPUSH', served, string.format('%d', now + keep) .. ' ' .. run)
  keep_parked(served)
end

-- Admitted: one start counted at every rate; its rate reference served.
local function rates_admit(rates, run, keep, now, now_us, copy)
  for _, r in ipairs(rates) do
    r.tat = math.max(r.tat, now_us) + r.interval
    write_rate(r, {'tat', string.format('%d', r.tat)}, now_us)
    if r.ref then serve_rate(r, run, keep, now, copy) end
  end
end

-- A copy moved out of rate `j`'s parking queue while its run waits there, past its max
-- wait (deadline.lua): given up, its reference served (no other copy of it runs), and a
-- copy a deadline move brought gives the line one start back (rate_gave_up). Brought by
-- a deadline move due for another run, it parks again keeping its promise (a new park
-- id). Returns the reply's fields after `now` (status, j, ...), or nil: it asks on.
local function rate_late(rates, j, run, max_wait, keep, now, now_us)
  local r = rates[j]
  if not r or not r.ref or r.ref.state ~= 'w' then return nil end
  local late = deadline_arrived(r.key, now, run)
  if past_deadline(r.ref.since, max_wait, now) then
    serve_rate(r, run, keep, now)
    if late then rate_gave_up(r.key, r.ref, r.interval, now_us) end
    return {5, j, r.ref.since, 0, 0, 0}
  end
  if not late then return nil end
  local id = 'r:' .. redis.call('HINCRBY', parked_key(r.key, 'pn'), 'n', 1)
  write_ref(r.key, run, 'w', r.ref.since, id, r.ref.holder)
  local promise = tonumber(r.ref.holder) or 0
  return {7, j, 0, promise > 0 and math.ceil(math.max(0, promise - now_us) / 1000) or -1, -1, id}
end

-- The run parks at a semaphore: a waiting rate reference keeps its turn; a rerun's
-- served one is dropped (the copy moved for it later is another).
local function keep_turn(rates, run)
  for _, r in ipairs(rates) do
    local ref = r.ref
    if ref and ref.state == 'w' then
      write_ref(r.key, run, 't', ref.since, ref.park_id, ref.holder)
    elseif r.rerun then
      redis.call('HDEL', parked_key(r.key, 'pr'), run)
    end
  end
end

-- Park the run at rate `at` for `start` (us): its one rate reference (a new park id; its
-- first refusal's time kept, else `first`), its deadline past `max_wait` (deadline.lua),
-- its start on the FIFO (at the head for a turn), every line past it. Returns the park id
-- and the wait (ms; -1 for a pause with no end).
local function rates_park(rates, at, start, turn, run, keep, index, now, now_us, max_wait,
                          first)
  local r, since = rates[at], first or string.format('%d', now)
  for j, o in ipairs(rates) do
    if o.ref and o.ref.since ~= '' then since = o.ref.since end
    if j ~= at and o.ref then redis.call('HDEL', parked_key(o.key, 'pr'), run) end
  end
  parked_deadline(r.key, run, since, max_wait)
  local counts = parked_key(r.key, 'pn')
  local id = 'r:' .. redis.call('HINCRBY', counts, 'n', 1)
  redis.call('HSET', counts, 'k', keep, 'iv', string.format('%d', r.base))
  keep_parked(counts)
  redis.call('ZADD', index, now, r.key)
  keep_parked(index)  -- the index lives as long as the lines it names
  if r.paused then
    redis.call('HINCRBY', counts, 'p', 1)
    write_ref(r.key, run, 'w', since, id, '0')
    return id, r.paused < 0 and -1 or r.paused - now
  end
  write_ref(r.key, run, 'w', since, id, string.format('%d', start))
  local fifo = parked_key(r.key, 'pq')
  redis.call(turn and 'LPUSH' or 'RPUSH', fifo, fifo_entry(plan_map(r.key), start))
  keep_parked(fifo)
  if not turn then
    for _, o in ipairs(rates) do
      o.line = math.max(o.line, start) + o.interval
      write_rate(o, {'line', string.format('%d', o.line)}, now_us)
    end
  end
  return id, math.ceil((start - now_us) / 1000)
end
