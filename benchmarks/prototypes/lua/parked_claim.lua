-- (c) A message moved out of the parking queue takes the oldest live reservation.
-- KEYS[1] semaphore, KEYS[2] reservations. ARGV: member, lease ms.
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local oldest = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ms, '+inf', 'LIMIT', 0, 1)
if #oldest == 0 then return 0 end
redis.call('ZREM', KEYS[2], oldest[1])
redis.call('ZREM', KEYS[1], '~' .. oldest[1])
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
return 1
