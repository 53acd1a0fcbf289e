-- (c) Release a holder; if runs are parked, reserve the slot for the next one out of the
-- parking queue (a numbered reservation) and tell the caller to move one message.
-- KEYS[1] semaphore, KEYS[2] line state (hash), KEYS[3] reservations (sorted set).
-- ARGV: member, reserve ms. Returns 1 (move one) or 0.
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
local waiting = tonumber(redis.call('HGET', KEYS[2], 'waiting') or '0')
if waiting <= 0 then return 0 end
redis.call('HINCRBY', KEYS[2], 'waiting', -1)
local number = redis.call('HINCRBY', KEYS[2], 'moved', 1)
redis.call('ZADD', KEYS[3], ms + tonumber(ARGV[2]), number)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), '~' .. number)
return 1
