-- (issue 29 on (c)) Release a holder and hand the slot to the tenant whose turn is
-- lowest: one ZRANGE, whatever the number of tenants waiting. The tenant's next turn is
-- its turn + 1 / weight (weights in the key's control hash, default 1).
-- KEYS[1] semaphore, KEYS[2] turns, KEYS[3] fair state, KEYS[4] weights (hash),
-- KEYS[5] the prefix of the sub-lines (sub-line = prefix .. tenant).
-- ARGV: member. Returns {tenant, reference} or false.
redis.call('ZREM', KEYS[1], ARGV[1])
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 0 then return false end
local tenant, turn = first[1], tonumber(first[2])
local line = KEYS[5] .. tenant
local reference = redis.call('LPOP', line)
local weight = tonumber(redis.call('HGET', KEYS[4], tenant) or '1')
local next_turn = turn + 1 / weight
redis.call('HSET', KEYS[3], 'v', turn, 'l:' .. tenant, next_turn)
if redis.call('LLEN', line) > 0 then
  redis.call('ZADD', KEYS[2], next_turn, tenant)
else
  redis.call('ZREM', KEYS[2], tenant)
end
return {tenant, reference}
