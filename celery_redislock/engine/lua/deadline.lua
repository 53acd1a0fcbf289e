-- Deadlines of parked runs (a task's lock_max_wait): a run parked longer than its max
-- wait is given up, within about a poll of its deadline, without a scan. (This text is
-- put in front of the scripts, after parking.lua; see scripts.py.)
--
-- Companions of a semaphore K (same hash tag, see parking.lua):
--
--   '}:pd:'  sorted set, run (with its sub-line, for a fair line's: '<run>\031<sub>') ->
--            its deadline (ms): its first 'since' + its max wait; written when it parks,
--            dropped when its reference stops waiting (claimed, left, given up), or
--            found so by the poll; put 0.5 s ahead while a deadline move is in flight
--            (and half a millisecond: a deadline is whole ms, a held one is not)
--   '}:pn:'  fields 'd': how many deadline moves of K are in flight, 'dt' until when
--
-- The poll (due.lua) reads the deadlines passed (ZRANGEBYSCORE, O(log n) + those due)
-- and owes one *deadline move* per run due that is not in flight ('!late <count> K',
-- out of the run's sub-line's parking queue for a fair line): the head of that parking
-- queue is moved with no slot reserved for it. The parking queue is
-- FIFO and the deadlines of one max wait follow it, so the head is the run due. Its
-- admission (admit_parked.lua, as the copy's home) answers it given up (status 5): its
-- reference and deadline dropped, nothing held. A moved copy whose deadline has not
-- passed (mixed max waits on one key: a run with a longer one, or none, parked before)
-- asks as a newcomer: it takes a free slot if nobody else waits, else it parks again at
-- the end of the line (its 'since', hence its deadline, kept). So do copies queued in
-- another order than their deadlines (two workers parking at once). A copy whose
-- deadline was not held took a move owed for another run: that run is owed one again
-- at the next poll (owed_again), not once the hold lapses. So a run is given up about a
-- poll later per run with a later deadline queued before it: give one key one max
-- wait. (A fair line's count of messages per
-- sub-line, fair.lua, does not see a deadline move: the move it later owes there finds
-- the parking queue empty and gives its reservation back, moved_nothing.lua.)

-- The member of a run's deadline: the run, and its sub-line for a fair line's.
local function deadline_member(run, sub)
  if sub == nil or sub == '' then return run end
  return run .. '\031' .. sub
end

-- A deadline's member as its run and its sub-line ('' for none).
local function deadline_run(member)
  local at = string.find(member, '\031', 1, true)
  if not at then return member, '' end
  return string.sub(member, 1, at - 1), string.sub(member, at + 1)
end

local function parked_deadline(key, run, since, max_wait, sub)
  if not max_wait then return end
  local name = parked_key(key, 'pd')
  redis.call('ZADD', name, (tonumber(since) or 0) + max_wait, deadline_member(run, sub))
  keep_parked(name)
end

local function drop_deadline(key, run, sub)
  redis.call('ZREM', parked_key(key, 'pd'), deadline_member(run, sub))
end

-- Whether a run first refused at `since` (ms, text) has waited its max wait by `now`.
local function past_deadline(since, max_wait, now)
  local first = tonumber(since or '')
  return max_wait ~= nil and first ~= nil and first + max_wait <= now
end

-- The poll: a deadline move of `key` owed to `out` ('!late <count> <key>[\031<sub>]')
-- per run whose deadline passed (at most LATE_MOVES a poll) and that still waits; its
-- deadline is then put LATE_HOLD_MS ahead (the move in flight: owed again after that,
-- had its copy not come). Entries of runs that no longer wait are dropped.
local LATE_MOVES = 100
local LATE_HOLD_MS = 500
local HELD = 0.5

local function is_held(score)
  return score ~= nil and score % 1 ~= 0
end

local function deadline_moves(key, now, out)
  local name, counts = parked_key(key, 'pd'), parked_key(key, 'pn')
  local due_now = redis.call('ZRANGEBYSCORE', name, '-inf', now, 'LIMIT', 0, LATE_MOVES)
  if #due_now == 0 then return end
  local refs = parked_key(key, 'pr')
  local subs, order, moved, again = {}, {}, 0, {'ZADD', name}
  for _, member in ipairs(due_now) do
    local run, sub = deadline_run(member)
    local ref = parse_ref(redis.call('HGET', refs, run))
    if ref and ref.state == 'w' then
      if not subs[sub] then order[#order + 1] = sub end
      subs[sub] = (subs[sub] or 0) + 1
      moved = moved + 1
      again[#again + 1] = now + LATE_HOLD_MS + HELD
      again[#again + 1] = member
    else
      redis.call('ZREM', name, member)  -- it no longer waits: claimed, left, served
    end
  end
  if moved == 0 then return end
  redis.call(unpack(again))
  redis.call('HINCRBY', counts, 'd', moved)
  redis.call('HSET', counts, 'dt', now + LATE_HOLD_MS)
  for _, sub in ipairs(order) do
    local line = key
    if sub ~= '' then line = key .. '\031' .. sub end
    out[#out + 1] = '!late ' .. subs[sub] .. ' ' .. line
  end
  for _ = 1, moved do cost_moved(key) end  -- the heads leave (parked_cost.lua)
end

-- A deadline move brought the copy whose deadline is `member`, not held: the move was
-- owed for another run of its sub-line, which still waits, held: the first held is owed
-- again (its score back to the poll that found it due, which its deadline had passed).
local function owed_again(key, member, now)
  local name = parked_key(key, 'pd')
  if is_held(tonumber(redis.call('ZSCORE', name, member) or '')) then return end
  local _, sub = deadline_run(member)
  local ahead = redis.call('ZRANGEBYSCORE', name, '(' .. now, now + LATE_HOLD_MS + HELD,
                           'WITHSCORES', 'LIMIT', 0, LATE_MOVES)
  for i = 1, #ahead, 2 do
    local score, _, other = tonumber(ahead[i + 1]), deadline_run(ahead[i])
    if is_held(score) and other == sub then
      redis.call('ZADD', name, score - LATE_HOLD_MS - HELD, ahead[i])
      return
    end
  end
end

-- A copy moved out of `key`'s parking queue reached its admission: true if a deadline
-- move was in flight (this copy is taken for one: it was moved with no slot reserved).
-- `member`: its deadline's (deadline_member), for owed_again; false: not looked at.
local function deadline_arrived(key, now, member)
  local counts = parked_key(key, 'pn')
  local flight = redis.call('HMGET', counts, 'd', 'dt')
  local n = tonumber(flight[1] or '0') or 0
  if n <= 0 then return false end
  local held = tonumber(flight[2] or '0') or 0
  if n == 1 or held <= now then
    redis.call('HDEL', counts, 'd', 'dt')
  else
    redis.call('HSET', counts, 'd', n - 1)
  end
  if held <= now then return false end
  if member ~= false then owed_again(key, member, now) end
  return true
end

-- Rate keys (rate_parked.lua, parked_rates.lua) keep deadlines the same way: '<R>:pd' and
-- the deadline moves in flight in '<R>:pn', owed by due_rate.lua. A run given up there
-- was moved with its promised start still on R's FIFO ('<R>:pq'): the line gives one start
-- back, the LAST one (the copies still parked take the earlier starts in turn), and R's
-- 'line' comes back to it when it is the line's last start (`interval` us before 'line');
-- a run parked while R was paused (promised no start yet) leaves R's count 'p' instead.
local function rate_gave_up(key, ref, interval, now_us)
  local counts = parked_key(key, 'pn')
  if ref.holder == '0' and (tonumber(redis.call('HGET', counts, 'p') or '0') or 0) > 0 then
    redis.call('HINCRBY', counts, 'p', -1)
    return
  end
  local fifo = parked_key(key, 'pq')
  local tail = tonumber(redis.call('LINDEX', fifo, -1) or '')
  if not tail then return end
  tail = fifo_start(plan_map(key), tail)
  redis.call('LTRIM', fifo, 0, -2)
  local line = tonumber(redis.call('HGET', key, 'line') or '') or 0
  if line >= tail and line <= tail + interval + 1 then
    redis.call('HSET', key, 'line', string.format('%d', math.max(tail, now_us)))
  end
end
