-- The names of a semaphore's parked-line companions (parking.lua describes them), and
-- the one step on them that scripts outside the parked line take: the end of a claim
-- moves with its holder's lease (renew.lua, adopt.lua). Put in front of parking.lua
-- and of those two scripts (see scripts.py).

-- Companion `mark` of semaphore `key`: '<prefix>{<digest>}:s:<name>' gives
-- '<prefix>{<digest>}:<mark>:<name>' (same hash tag); a key with no hash tag, '<key>:<mark>'.
local function parked_key(key, mark)
  local at = string.find(key, '}:s:', 1, true)
  if not at then return key .. ':' .. mark end
  return string.sub(key, 1, at) .. ':' .. mark .. ':' .. string.sub(key, at + 4)
end

-- The claims' ends of `key` ('}:pe:').
local function claim_ends(key)
  return parked_key(key, 'pe')
end

-- The claim holder `token` made on a parked run at `key`, if it has one, now ends at
-- `lease_end` (ms), its lease's new end: a claim lapses only once its holder's lease ran
-- out (parking.lua's lapse_claims).
local function claim_moves(key, token, lease_end)
  redis.call('ZADD', claim_ends(key), 'XX', lease_end, token)
end
