-- The lock store's incarnation: shared by the scripts that grant or renew slots. (This
-- text is put in front of those scripts when they are loaded; see scripts.py.)
--
-- '<prefix>incarnation' is a hash written once per key space, by the first script that
-- finds it missing; a restart of Redis that lost its data, or a flush, erases it:
--
--   'born'   when it was written (server time, us)
--   'grace'  0, or the end (ms) of the grace that follows a loss of the store's data:
--            until then no slot is granted afresh, while the holders of before the loss
--            re-assert their leases (renew.lua), as Chubby's new master does. It lasts
--            the longest lease any caller declares (every call carries the longest
--            lease its process knows of), counted from 'born'
--   'keep'   when (ms) its time to live is next extended: it lives 7 days, extended by
--            admissions and worker registrations once half of that has passed, so a key
--            space left idle for a week leaves nothing behind (a process that used it
--            before then waits one lease at its next admission)
--
-- A missing incarnation means a loss when the caller has seen an earlier one (it passes
-- the latest 'born' or fencing number it saw, 0 if none: a first start of a deployment).
-- On Redis Cluster the hash would live in another slot than the semaphores: callers say
-- so (seen -1, epoch 0, no key space), nothing writes it, and there is no grace.

-- The incarnation key of the key space of `key` ('<prefix>{...}...'), or nil.
local function incarnation_key(key)
  local at = string.find(key, '{', 1, true)
  if not at then return nil end
  return string.sub(key, 1, at - 1) .. 'incarnation'
end

local INCARNATION_TTL = 7 * 24 * 3600 * 1000

-- {born_us, grace_end_ms, keep_ms} of incarnation key `marker`; nil if it is missing;
-- false if it cannot be read from this script (Redis Cluster).
local function incarnation(marker)
  local state = redis.pcall('HMGET', marker, 'born', 'grace', 'keep')
  if type(state) ~= 'table' or state.err then return false end
  if not state[1] then return nil end
  return {tonumber(state[1]), tonumber(state[2] or '0') or 0, tonumber(state[3] or '0') or 0}
end

-- Extend the incarnation's time to live (see 'keep').
local function keep_incarnation(marker, now)
  redis.call('PEXPIRE', marker, INCARNATION_TTL)
  redis.call('HSET', marker, 'keep', string.format('%d', now + INCARNATION_TTL / 2))
end

-- Write a new incarnation; `grace_ms` > 0 after a loss. Returns it as incarnation() does.
local function new_incarnation(marker, now, now_us, grace_ms)
  local grace = 0
  if grace_ms > 0 then grace = now + grace_ms end
  redis.call('HSET', marker, 'born', string.format('%d', now_us),
             'grace', string.format('%d', grace))
  keep_incarnation(marker, now)
  return {now_us, grace, now + INCARNATION_TTL / 2}
end

-- After a loss (the incarnation has a grace, or the caller knows of one: `lost`), a
-- caller that declares a longer bound `grace_ms` (the longest lease its process knows
-- of) than the grace covers extends it to 'born' + that bound, even once it ended: a
-- holder of before on that long a lease may still re-assert. The grace (ms) as it now
-- stands.
local function extend_grace(marker, state, grace_ms, lost)
  local until_ms = math.floor(state[1] / 1000) + grace_ms
  if (lost or state[2] > 0) and until_ms > state[2] then
    redis.call('HSET', marker, 'grace', string.format('%d', until_ms))
    state[2] = until_ms
  end
  return state[2]
end

-- The incarnation of incarnation key `marker` as `seen` (see above) finds it: written if
-- missing (a loss if seen > 0, then with a grace of `grace_ms`), kept alive, its grace
-- extended to `grace_ms` after a loss; nil if missing and there is no `seen`, false on
-- Redis Cluster.
local function incarnation_for(marker, now, now_us, seen, grace_ms)
  local state = incarnation(marker)
  if state == false then return false end
  if state == nil then
    if not seen then return nil end
    local lost = 0
    if seen > 0 then lost = grace_ms end
    return new_incarnation(marker, now, now_us, lost)
  end
  if seen and state[3] < now then keep_incarnation(marker, now) end
  if grace_ms then extend_grace(marker, state, grace_ms) end
  return state
end

-- The end (ms) of the grace of the key space of `key` if it is on now, else nil. With
-- `seen` and `grace_ms` as incarnation_for() takes them; without them nothing is written.
local function grace_of(key, now, now_us, seen, grace_ms)
  local marker = incarnation_key(key)
  if not marker or (seen and seen < 0) then return nil end
  local state = incarnation_for(marker, now, now_us, seen, grace_ms)
  if state and state[2] > now then return state[2] end
  return nil
end
