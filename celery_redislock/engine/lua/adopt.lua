-- A process takes over a holder admitted by another one (a worker's main process admits,
-- the pool process that runs the task adopts): in N leased semaphores, the holder's
-- member is replaced by one with the adopter's description, and its lease renewed
-- (with its units: units.lua is put in front of this script), and the end of a claim
-- the holder made on a parked run with it (claim_moves: parked_names.lua, put in front).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the member written at admission
-- ARGV[2]   the adopter's member (same token, time and fence; its own description)
-- ARGV[3]   lease length (ms), counted from now on the server's clock
-- ARGV[3+i] the holder's cost in semaphore i, if above 1; missing: 1
--
-- Returns the new end of the lease (ms), or 0 when the holder had no live lease left in
-- one of the semaphores (then nothing is changed: the adopter must not run on it).

local old, new = ARGV[1], ARGV[2]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local lease_end = now + tonumber(ARGV[3])

-- The holder's entry, and when the key's time to live ends as recorded ('#ttl', see
-- line.lua: minus that time, less a second), or false.
local ttl_ends = {}
for i = 1, #KEYS do
  local scores = redis.call('ZMSCORE', KEYS[i], old, '#ttl')
  if not (scores[1] and tonumber(scores[1]) > now) then return 0 end
  ttl_ends[i] = scores[2] and -tonumber(scores[2])
end
for i = 1, #KEYS do
  claim_moves(KEYS[i], token_of(old), lease_end)
  redis.call('ZREM', KEYS[i], old)
  redis.call('ZADD', KEYS[i], lease_end, new)
  add_units(KEYS[i], token_of(old), cost_of(3, i), lease_end, 'XX')
  local ttl_end = ttl_ends[i] or (now + redis.call('PTTL', KEYS[i]))
  if ttl_end < lease_end then
    -- A second more than the lease: the record may be up to a second early, and the
    -- key must never be shortened. Recorded as admit.lua reads it.
    local keep = tonumber(ARGV[3]) + 1000
    redis.call('ZADD', KEYS[i], string.format('%d', 1000 - (now + keep)), '#ttl')
    redis.call('PEXPIRE', KEYS[i], keep)
  end
end
return lease_end
