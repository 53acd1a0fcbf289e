-- Admit one run past a rate limiter on the parked line, on the server's clock; a run
-- whose start is far parks as ONE message in the rate key's parking queue, and this
-- script writes its reference and its promised start in the same call. (store.lua,
-- units.lua, fair.lua, parking.lua and line.lua are put in front of this script.)
-- One rate limiter of cost 1 (with no semaphore): see engine/parking_rate.py.
--
-- The rate key R ('<prefix>{<digest>}:r:<name>', admit.lua's hash: 'tat' the GCRA's
-- theoretical arrival time, 'line' the end of the promised starts, us) has companions
-- (same hash tag, parking.lua's parked_key: R .. ':' .. mark):
--   R:pq  list, the promised starts (us) of the parked copies, in promise order (the
--         GCRA promises increasing starts, so the list is a FIFO sorted by start): the
--         poll (due_rate.lua) pops every head due within its lead and owes one move out
--         of R's parking queue per head
--   R:pr  hash, run -> 'w since park_id promise' (waiting), 'b since park_id' (booked a
--         start: its copy still has its turn if it asks again) or 's' (served); booked
--         and served ones are kept 'k' ms, pruned through R:px as parking.lua's are
--   R:pn  hash: 'n' the last park number, 'k' how long a served reference is kept, 'iv'
--         the interval (us) of the last park, 'p' the runs parked while the rate was
--         paused (promised no start yet: the poll promises them starts once it ends), 'e'
--         since when the poll saw R's parking queue hold messages that R:pq does not know
-- and the index '<prefix>parked:rate' (sorted set, R -> when a run last parked there).
--
-- KEYS[1]  the rate key R         KEYS[2]  the index of rate keys with a parked line
-- ARGV[1]  the run '<task id>:<attempt>'
-- ARGV[2]  the park id of a copy moved out of R's parking queue ('' for none), then,
--          ' ' and the copy's id: a reference served to this very copy (its reply
--          lost, or given back unacknowledged) lets it ask again as a newcomer
-- ARGV[3]  how long a served reference is kept (ms)
-- ARGV[4]  how far ahead (ms) the caller takes a booked start (0: it does not hold runs)
-- ARGV[5]  the rate's interval (us)      ARGV[6]  its tolerance (us: burst x interval)
-- ARGV[7]  the lease (ms)
-- ARGV[8]  the run's max wait (ms; '' or missing: none): a run parked that long is given
--          up (status 5), its deadline kept in R:pd and moved for by the poll (deadline.lua)
--
-- A newcomer (or a moved copy the store does not know: its data was lost) is admitted
-- when no promised start is ahead of it and the GCRA allows (admit.lua's rule), else it
-- is promised the start at the end of the line: within ARGV[4] the start is booked
-- (counted as taken then: the caller holds the run and starts it without asking), else
-- the run parks. A moved copy whose reference names its park id had its turn (the poll
-- moved it for a start due now): it takes the first start the GCRA allows, now or
-- booked within ARGV[4]; later than that (rare: others took the starts), it parks again
-- at the end of the line. Each admission or booking counts one start in 'tat', as
-- admit.lua does: in any period there are never more starts than the rate and its burst.
--
-- Replies (admit_parked.lua's):
--   "now_ms lease_end_ms 0 1 0"                 admitted now
--   {6, now, 1, start_us, wait_ms, tat, ahead}  booked from start_us (refund.lua gives it back)
--   {7, now, 1, 0, wait_ms, -1, park_id}        parked: publish the copy to R's parking queue
--   {4, now, 1, 0, 0, 0, 0}                     stale or served: end this copy unrun
--   {5, now, 1, since, 0, 0, 0}                 given up: it waited its max wait since
--        `since` (ms); its reference is served (no other copy of it runs), nothing held

local key, index = KEYS[1], KEYS[2]
local run, keep = ARGV[1], tonumber(ARGV[3])
local park_id, copy = string.match(ARGV[2], '^(%S*) ?(%S*)$')
local book_us = (tonumber(ARGV[4]) or 0) * 1000
local interval, tolerance, lease = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local max_wait = tonumber(ARGV[8] or '')
local now, now_us = server_now()

-- The operators' pause and rate set at run time (admit.lua's rate_control).
local control = redis.call('HMGET', string.gsub(key, '}:r:', '}:cr:', 1), 'paused_until',
                           'interval')
local paused = pause_end(control[1], now)
local override = tonumber(control[2] or '')
if override and override > 0 then
  if interval > 0 then tolerance = tolerance / interval * override end
  interval = override
end

replan_rate(key, interval, now_us)  -- a rate changed at run time (rate_plan.lua)
local saved = redis.call('HMGET', key, 'tat', 'line')
local tat = math.max(tonumber(saved[1] or '0') or 0, now_us)
local line = math.max(tonumber(saved[2] or '0') or 0, now_us)
local refs, counts = parked_key(key, 'pr'), parked_key(key, 'pn')
prune_served(key, now)
local ref = parse_ref(redis.call('HGET', refs, run))
local rerun = ref and ref.state == 's' and copy ~= '' and ref.copy == copy
if ref and ref.state == 's' and not rerun then return {4, now, 1, 0, 0, 0, 0} end
local moved = park_id ~= '' and ref ~= nil and not rerun
if moved and ref.park_id ~= park_id then
  return {4, now, 1, 0, 0, 0, 0}  -- a stale copy: the run parked again since, or ran
end

-- Write the rate's state and keep R alive a second past the last start it counts or
-- promised (at least the minute admit.lua gives it).
local function write_state(fields)
  redis.call('HSET', key, unpack(fields))
  local needed = math.ceil((math.max(tat, line) - now_us) / 1000) + 1000
  if redis.call('PTTL', key) < needed then
    redis.call('PEXPIRE', key, math.max(2 * needed, 60000))
  end
end

-- The run's reference is served: a copy of it that comes later ends unrun (but this
-- very copy, acking late: parking.lua's parse_ref).
local function serve()
  if not ref then return end
  drop_deadline(key, run)
  write_ref(key, run, 's', ref.since, ref.park_id, '', '', copy)
  local served = parked_key(key, 'px')
  redis.call('RPUSH', served, string.format('%d', now + keep) .. ' ' .. run)
  keep_parked(served)
end

local function admit()
  tat = math.max(tat, now_us) + interval
  write_state({'tat', string.format('%d', tat)})
  serve()
  return string.format('%d %d 0 1 0', now, now + lease)
end

-- Booked: the caller holds the run and starts it without asking; or, late for its start
-- (no pool process free in time), gives the start back and asks again: a parked run's
-- reference becomes 'b' under the same park id, so that this copy (or the broker's
-- redelivery of it) still has its turn; it is forgotten 'k' ms later, as served ones are.
local function book(start)
  tat = math.max(tat, start) + interval
  write_state({'tat', string.format('%d', tat), 'line', string.format('%d', line)})
  if ref then
    drop_deadline(key, run)
    write_ref(key, run, 'b', ref.since, ref.park_id, '')
    local served = parked_key(key, 'px')
    redis.call('RPUSH', served, string.format('%d', now + keep) .. ' ' .. run)
    keep_parked(served)
  end
  return {6, now, 1, string.format('%d', start), math.ceil((start - now_us) / 1000),
          string.format('%d', tat), math.max(0, math.floor((start - now_us) / interval))}
end

-- Park the run for the start `promise` at the end of the line: its reference (a new park
-- id, its first 'since' kept) and its promise at the tail of R's FIFO.
local since = ref and ref.since ~= '' and ref.since or string.format('%d', now)
local function park(promise)
  local id = 'r:' .. redis.call('HINCRBY', counts, 'n', 1)
  redis.call('HSET', counts, 'k', keep, 'iv', string.format('%d', interval))
  keep_parked(counts)
  parked_deadline(key, run, since, max_wait)
  write_ref(key, run, 'w', since, id, string.format('%d', promise))
  local fifo = parked_key(key, 'pq')
  redis.call('RPUSH', fifo, fifo_entry(plan_map(key), promise))
  keep_parked(fifo)
  redis.call('ZADD', index, now, key)
  keep_parked(index)  -- the index lives as long as the lines it names
  write_state({'line', string.format('%d', line)})
  return {7, now, 1, 0, math.ceil((promise - now_us) / 1000), -1, id}
end

-- A copy the poll moved for a deadline (deadline.lua; no start is due for it): past its
-- max wait it is given up, else it parks again keeping its promise (its start is still on
-- the FIFO: the deadline move popped none).
local late = moved and ref.state == 'w' and deadline_arrived(key, now, run)
if moved and ref.state == 'w' and past_deadline(ref.since, max_wait, now) then
  serve()  -- any other copy of the run ends unrun
  if late then rate_gave_up(key, ref, interval, now_us) end
  return {5, now, 1, ref.since, 0, 0, 0}
end
if late then
  local id = 'r:' .. redis.call('HINCRBY', counts, 'n', 1)
  write_ref(key, run, 'w', ref.since, id, ref.holder)
  local promise = tonumber(ref.holder) or 0
  return {7, now, 1, 0, promise > 0 and math.ceil(math.max(0, promise - now_us) / 1000) or -1,
          -1, id}
end

-- Paused by an operator: the run parks with no promise yet, counted in 'p'; the poll
-- promises those runs the starts at the end of the line once the pause ends.
if paused then
  local id = 'r:' .. redis.call('HINCRBY', counts, 'n', 1)
  redis.call('HINCRBY', counts, 'p', 1)
  redis.call('HSET', counts, 'k', keep, 'iv', string.format('%d', interval))
  keep_parked(counts)
  parked_deadline(key, run, since, max_wait)
  write_ref(key, run, 'w', since, id, '0')
  redis.call('ZADD', index, now, key)
  keep_parked(index)  -- the index lives as long as the lines it names
  return {7, now, 1, 0, paused < 0 and -1 or paused - now, -1, id}
end

if moved then
  -- Its turn came (the poll moved it): the first start the GCRA allows.
  local start = tat - tolerance
  if now_us >= start then return admit() end
  if book_us > 0 and start - now_us <= book_us then return book(start) end
else
  local allowed = math.max(tat - tolerance, line - tolerance)
  if now_us >= allowed then return admit() end
end
-- The start at the end of the line, which is nobody else's.
local promise = math.floor(math.max(line, tat - tolerance))
line = promise + interval
if book_us > 0 and promise - now_us <= book_us then return book(promise) end
return park(promise)
