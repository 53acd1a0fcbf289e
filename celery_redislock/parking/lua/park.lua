-- Park one message: push it into its parking list and register the list, once per job.
-- KEYS[1] the parking list, KEYS[2] the registry hash, KEYS[3] the job's done marker.
-- ARGV[1] the message (kombu's JSON payload), ARGV[2] the semaphore key,
-- ARGV[3] the parking queue's name (unprefixed), ARGV[4] the marker's life (s).
-- Returns the list's length, or -1 when this job was done before (nothing pushed).
if not redis.call('SET', KEYS[3], 'parked', 'NX', 'EX', ARGV[4]) then
  return -1
end
local length = redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[2])
return length
