-- Set or clear an operator's override in the control hash KEYS[1] (set-slots,
-- clear-slots, set-rate, clear-rate), and give the hash the lifetime its fields then call
-- for (settle_control): an override lasts; a timed pause left alone expires at its end.
--
-- ARGV: 'set' field value [field value ...] | 'del' field [field ...].
-- Returns how many fields were removed ('del'), or 0.

local removed = 0
if ARGV[1] == 'set' then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
else
  removed = redis.call('HDEL', KEYS[1], unpack(ARGV, 2))
end
settle_control(KEYS[1], server_now_ms())
return removed
