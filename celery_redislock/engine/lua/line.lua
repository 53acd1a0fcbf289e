-- What the scripts that admit, release and hand over slots share about a semaphore:
-- its companion keys, the server's clock, its limit in force, its time to live, and the
-- hand-over of its free slots to its parked line (parking.lua). (This text is put in
-- front of those scripts when they are loaded; see scripts.py.)
--
-- A semaphore key K = '<prefix>{<digest>}:s:<name>' has companion keys with the same
-- hash tag, so one script may use them on Redis Cluster too:
--
--   '}:cs:' control hash, written by operators: 'slots' overrides the configured number
--           of slots, 'paused_until' (ms, or 'forever') refuses every run until then
--   '}:l:'  hash, holder member -> when its worker freed it for a run that died
--           (release_owner.lua, follow.lua)
--
-- and the parked line's companions (parking.lua).

local function companion(key, mark)
  local at = string.find(key, '}:s:', 1, true)
  if not at then return key .. ':' .. mark end
  return string.sub(key, 1, at) .. ':' .. mark .. ':' .. string.sub(key, at + 4)
end

local function server_now()
  local clock = redis.call('TIME')
  local seconds, micros = tonumber(clock[1]), tonumber(clock[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
end

-- 'paused_until' of a control hash: the end of the pause (ms, -1 = forever), or nil.
local function pause_end(value, now)
  if not value then return nil end
  if value == 'forever' then return -1 end
  local until_ms = tonumber(value)
  if until_ms and until_ms > now then return until_ms end
  return nil
end

-- The number of slots of semaphore `key`: the operator's override, else `configured`
-- (else what the last admission recorded in '#slots'); and the end of a pause, or nil.
local function semaphore_limit(key, configured, now)
  local control = redis.call('HMGET', companion(key, 'cs'), 'slots', 'paused_until')
  local slots = tonumber(control[1] or '') or configured
  if not slots then
    local recorded = redis.call('ZSCORE', key, '#slots')
    slots = recorded and -tonumber(recorded) or 1
  end
  return slots, pause_end(control[2], now)
end

-- A semaphore records when its time to live ends, as the member TTL_END scored minus
-- that time (ms), less a second of margin, written by every script that extends it (in
-- the same call): a script reads it with the semaphore's other statistics instead of
-- asking PTTL. A key written before the record was kept is asked (ttl_recorded).
local TTL_END = '#ttl'

local function ttl_score(expires_ms)
  return string.format('%d', 1000 - expires_ms)
end

-- When the time to live of semaphore `key` ends (ms), from its record `recorded` (the
-- score of TTL_END, or false); before `now` if it has none.
local function ttl_recorded(key, recorded, now)
  if recorded then return -tonumber(recorded) end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then return now - 1 end
  return now + ttl
end

-- The configured slots of semaphore `key` for a hand-over: nil (its '#slots' says), or
-- what its parked line recorded (`parked`, see parking.lua) when '#slots' is gone.
local function configured_slots(key, parked)
  if not (parked and parked[3]) or redis.call('ZSCORE', key, '#slots') then return nil end
  return parked[3]
end

-- Hand the free slots of semaphore `key` to its parked line, if it has one: the moves
-- owed out of its parking queue (parking.lua) are appended to `out`.
local function serve_line(key, now, reserve_ms, out)
  if reserve_ms <= 0 then return end
  local parked = parked_line(key)
  if not parked then return end
  if grace_of(key, now) then return end  -- after a loss of the store: nothing afresh yet
  redis.call('ZREMRANGEBYSCORE', key, 0, now)
  local slots, paused = semaphore_limit(key, configured_slots(key, parked), now)
  if paused then return end
  local free = slots - redis.call('ZCOUNT', key, '(' .. now, '+inf')
  if free > 0 then hand_over_parked(key, free, now, reserve_ms, out, parked) end
end
