-- Deadlines of parked runs (a task's lock_max_wait): a run parked longer than its max
-- wait is given up, within about a poll of its deadline, without a scan. (This text is
-- put in front of the scripts, after parking.lua; see scripts.py.)
--
-- Companions of a semaphore K (same hash tag, see parking.lua):
--
--   '}:pd:'  sorted set, run -> its deadline (ms): its first 'since' + its max wait;
--            written when it parks (not for a fair line's sub-lines), dropped when its
--            reference stops waiting (claimed, left, given up), or found so by the poll
--   '}:pn:'  fields 'd': how many deadline moves of K are in flight, 'dt' until when
--
-- The poll (due.lua) counts the deadlines passed (ZCOUNT: O(log n)) and owes as many
-- *deadline moves* ('!late <count> K') as are not in flight: the head of K's parking
-- queue is moved with no slot reserved for it, once per move. The parking queue is
-- FIFO and the deadlines of one max wait follow it, so the head is the run due. Its
-- admission (admit_parked.lua, as the copy's home) answers it given up (status 5): its
-- reference and deadline dropped, nothing held. A moved copy whose deadline has not
-- passed (mixed max waits on one key: a run with a longer one, or none, parked before)
-- asks as a newcomer: it takes a free slot if nobody else waits, else it parks again at
-- the end of the line (its 'since', hence its deadline, kept); the next poll moves the
-- next head. So with mixed max waits on one key, a run is given up about a poll later
-- per run with a later deadline parked before it: give one key one max wait.

local function parked_deadline(key, run, since, max_wait)
  if not max_wait then return end
  local name = parked_key(key, 'pd')
  redis.call('ZADD', name, (tonumber(since) or 0) + max_wait, run)
  keep_parked(name)
end

local function drop_deadline(key, run)
  redis.call('ZREM', parked_key(key, 'pd'), run)
end

-- Whether a run first refused at `since` (ms, text) has waited its max wait by `now`.
local function past_deadline(since, max_wait, now)
  local first = tonumber(since or '')
  return max_wait ~= nil and first ~= nil and first + max_wait <= now
end

-- The poll: the deadline moves of `key` owed to `out` ('!late <count> <key>'): one per
-- run whose deadline passed (ZCOUNT, at most LATE_MOVES a poll), less those in flight
-- (until now + hold_ms). Heads that no longer wait are dropped first (a few a call).
local LATE_MOVES = 100

local function deadline_moves(key, now, hold_ms, out)
  local name, counts = parked_key(key, 'pd'), parked_key(key, 'pn')
  for _ = 1, 8 do
    local first = redis.call('ZRANGE', name, 0, 0, 'WITHSCORES')
    if #first == 0 or tonumber(first[2]) > now then return end
    local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), first[1]))
    if ref and ref.state == 'w' then break end
    redis.call('ZREM', name, first[1])  -- it no longer waits: claimed, left, served
  end
  local late = math.min(redis.call('ZCOUNT', name, '-inf', now), LATE_MOVES)
  local flight = redis.call('HMGET', counts, 'd', 'dt')
  local in_flight = 0
  if (tonumber(flight[2] or '0') or 0) > now then in_flight = tonumber(flight[1] or '0') or 0 end
  if late <= in_flight then return end
  redis.call('HSET', counts, 'd', late, 'dt', now + hold_ms)
  for _ = 1, late - in_flight do cost_moved(key) end  -- the heads leave (parked_cost.lua)
  out[#out + 1] = '!late ' .. (late - in_flight) .. ' ' .. key
end

-- A copy moved out of `key`'s parking queue reached its admission: true if a deadline
-- move was in flight (this copy is taken for one: it was moved with no slot reserved).
local function deadline_arrived(key, now)
  local counts = parked_key(key, 'pn')
  local flight = redis.call('HMGET', counts, 'd', 'dt')
  local n = tonumber(flight[1] or '0') or 0
  if n <= 0 then return false end
  if n == 1 or (tonumber(flight[2] or '0') or 0) <= now then
    redis.call('HDEL', counts, 'd', 'dt')
    return (tonumber(flight[2] or '0') or 0) > now
  end
  redis.call('HSET', counts, 'd', n - 1)
  return true
end
