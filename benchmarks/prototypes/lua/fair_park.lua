-- (issue 29 on (c)) A waiter joins its tenant's sub-line of a fair key. A tenant that
-- starts waiting takes its turn at max(the key's virtual time, the turn it left with):
-- start-time fair queuing, so a tenant that waited in vain earns no credit.
-- KEYS[1] turns (sorted set tenant -> turn), KEYS[2] the tenant's sub-line (list of
-- references), KEYS[3] the key's fair state (hash: 'v' virtual time, 'l:'..tenant last
-- turn). ARGV: tenant, reference.
local length = redis.call('RPUSH', KEYS[2], ARGV[2])
if length == 1 then
  local state = redis.call('HMGET', KEYS[3], 'v', 'l:' .. ARGV[1])
  local turn = math.max(tonumber(state[1] or '0'), tonumber(state[2] or '0'))
  redis.call('ZADD', KEYS[1], turn, ARGV[1])
end
return length
