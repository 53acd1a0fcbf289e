-- The parking queues the registry knows that hold messages; the others are forgotten.
-- KEYS[1] the registry hash (parking queue -> semaphore key).
-- ARGV[1] the broker's global key prefix.
-- An entry whose list is empty is removed: park.lua pushes and registers in one step,
-- so a queue parked into later is registered again. Returns queue, key, queue, key...
local found = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  if redis.call('LLEN', ARGV[1] .. entries[i]) == 0 then
    redis.call('HDEL', KEYS[1], entries[i])
  else
    found[#found + 1] = entries[i]
    found[#found + 1] = entries[i + 1]
  end
end
return found
