-- A slots-only admission's uncontended path, for measuring what splitting admit.lua by
-- mode saves: the same work as admit.lua for a semaphore with no line, no operator
-- control and a free slot (answered the same way); anything else answers 'full' and the
-- caller asks the full script. KEYS[1] the semaphore, KEYS[2] its control hash.
-- ARGV: token, lease ms, description, slots.
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local stats = redis.call('ZMSCORE', KEYS[1], '#hold', '#fence')
if stats[1] or redis.call('EXISTS', KEYS[2]) == 1 then return 'full' end
if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') >= tonumber(ARGV[4]) then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now)
  if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') >= tonumber(ARGV[4]) then
    return 'full'
  end
end
local fence = 1 - tonumber(stats[2] or '0')
local lease_end = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], -fence, '#fence', lease_end,
           ARGV[1] .. ' ' .. now .. ' ' .. fence .. ' ' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.max(60000, 2 * tonumber(ARGV[2])))
return string.format('%d %d %d 0 0', now, lease_end, fence)
