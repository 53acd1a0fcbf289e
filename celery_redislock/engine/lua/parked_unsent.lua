-- References whose copy may never come. A run parked by the process that runs it (a pool
-- process, or the greenlet of a gevent or eventlet worker: pool/pool_park.py) has
-- its copy published by that process after the refusal wrote its reference; under
-- default acks its message was acknowledged before, so a process that dies in between
-- loses the run (Celery's own loss: its body would have been running) and no copy of it
-- ever comes. Such a reference waits, until a bound, for its copy's publish to be
-- confirmed (parked_sent.lua); unconfirmed by then it lapses as a claim does
-- (parking.lua's lapse_claims): it is no longer counted as waiting, and is forgotten
-- 'k' ms later (as long as the broker may give a copy back) unless rewritten since. A
-- copy whose confirmation alone was lost still finds it meanwhile, and is counted again.
-- (This text is put in front of the scripts after parking.lua; see scripts.py.)
--
-- Companion of a semaphore K (same hash tag, see parking.lua):
--
--   '}:pu:'  sorted set, '<park id> <run>' -> by when (ms) its copy's publish is to be
--            confirmed; '!<park id> <run>' -> when a lapsed reference is forgotten (ms)

local LAPSE_UNSENT = 8

-- The reference of `run` at `key`, parked as `park_id`, waits for its copy's publish to
-- be confirmed until `until_ms`.
local function await_copy(key, run, park_id, until_ms)
  local pending = parked_key(key, 'pu')
  redis.call('ZADD', pending, string.format('%d', until_ms), park_id .. ' ' .. run)
  keep_parked(pending)
end

-- The copy of `run`, parked at `key` as `park_id`, is in its parking queue (or reached
-- its admission): its reference no longer waits for the confirmation; one that lapsed
-- meanwhile and still waits is counted again (`counts`: parking.lua's parked_line, or
-- nil). Returns 1 if the reference was awaiting it.
local function copy_sent(key, run, park_id, counts)
  local pending, entry = parked_key(key, 'pu'), park_id .. ' ' .. run
  if redis.call('ZREM', pending, entry) == 1 then return 1 end
  if redis.call('ZREM', pending, '!' .. entry) == 0 then return 0 end
  local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
  if ref and ref.state == 'w' and ref.park_id == park_id then
    local names = parked_key(key, 'pn')
    redis.call('HINCRBY', names, 'w', 1)
    if counts then counts[1] = counts[1] + 1 end
    if tonumber(redis.call('HGET', names, 'a') or '0') > 0 then
      -- the poll counted its copy meanwhile as an anonymous entry (due.lua)
      redis.call('HINCRBY', names, 'a', -1)
      if counts then counts[2] = math.max(0, counts[2] - 1) end
    end
  end
  return 1
end

-- References whose copy's publish was not confirmed in time lapse, a few at each call of
-- the line's scripts, in the order their bounds ran out (the server's clock): a waiting
-- one is no longer counted, then forgotten 'k' ms later if still the same.
local function lapse_unsent(key, now, counts)
  local pending = parked_key(key, 'pu')
  local lapsed = redis.call('ZRANGEBYSCORE', pending, '-inf', now, 'LIMIT', 0, LAPSE_UNSENT)
  if #lapsed == 0 then return end
  redis.call('ZREM', pending, unpack(lapsed))
  local refs = parked_key(key, 'pr')
  for _, entry in ipairs(lapsed) do
    local forget, park_id, run = string.match(entry, '^(!?)(%S+) (.+)$')
    local ref = run and parse_ref(redis.call('HGET', refs, run))
    if ref and ref.state == 'w' and ref.park_id == park_id then
      if forget == '!' then
        redis.call('HDEL', refs, run)
      else
        count_down_waiting(key, counts or parked_line(key) or {0, 0})
        local keep = tonumber(redis.call('HGET', parked_key(key, 'pn'), 'k') or '') or 3600000
        redis.call('ZADD', pending, string.format('%d', now + keep), '!' .. entry)
      end
    end
  end
end
