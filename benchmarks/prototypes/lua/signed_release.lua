-- (b) Release a holder and hand its slot to the oldest waiter: reserve the slot for its
-- ticket and return its signed message for the caller to check and publish. The message
-- stays (in 'moving', KEYS[4]: ticket -> until) until the run claims the slot, so that a
-- caller that dies before publishing loses nothing (it is handed again after 'until').
-- KEYS[1] semaphore, KEYS[2] line, KEYS[3] messages, KEYS[4] moving.
-- ARGV: member, reserve ms.
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
local ticket = redis.call('LPOP', KEYS[2])
if not ticket then return false end
local message = redis.call('HGET', KEYS[3], ticket)
redis.call('ZADD', KEYS[4], ms + tonumber(ARGV[2]), ticket)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), '~' .. ticket)
return {ticket, message}
