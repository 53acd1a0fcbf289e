-- (a) Release a holder and hand its slot to the oldest waiter: reserve the slot for its
-- ticket and wake the node that holds it (PUBLISH to 'wake:<node>').
-- KEYS[1] semaphore, KEYS[2] line, KEYS[3] ticket -> node. ARGV: member, reserve ms.
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
local ticket = redis.call('LPOP', KEYS[2])
if not ticket then return false end
local node = redis.call('HGET', KEYS[3], ticket)
redis.call('HDEL', KEYS[3], ticket)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), '~' .. ticket)
redis.call('PUBLISH', 'wake:' .. node, ticket)
return ticket
