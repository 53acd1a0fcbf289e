-- (a), (b) The waiter handed a slot takes it: its reservation becomes its lease.
-- KEYS[1] semaphore, KEYS[2] messages (or ''), KEYS[3] moving (or '').
-- ARGV: ticket, member, lease ms.
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
if redis.call('ZREM', KEYS[1], '~' .. ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[3]), ARGV[2])
if KEYS[2] ~= '' then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return 1
