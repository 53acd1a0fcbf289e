-- (b) The lock store keeps the waiting run: its ticket in the line and its message,
-- signed by the worker (HMAC), beside it. Idempotent per ticket (a redelivered original
-- parks once). KEYS[1] the line, KEYS[2] ticket -> signed message. ARGV: ticket, message.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[1], ARGV[1])
end
return redis.call('LLEN', KEYS[1])
