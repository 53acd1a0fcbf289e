-- (c) The run's message waits in the broker, in the key's parking queue; the lock store
-- only counts it (before the message is parked: a count too high is corrected by a
-- release that finds the queue empty, a count too low would strand a run).
-- KEYS[1] the key's line state (hash). Returns the count.
return redis.call('HINCRBY', KEYS[1], 'waiting', 1)
