-- Give back every slot held by tokens that start with a prefix, in N leased semaphores.
--
-- Tokens of task runs are "<worker node>|<task id>|<random>", so a worker's main process
-- can free the slots of a pool child that died without running its own cleanup
-- (prefix "<node>|<task id>|"), or of its own previous life after a restart ("<node>|").
--
-- KEYS[2i-1], KEYS[2i]  holders and details of semaphore i (see admit.lua)
-- ARGV[1]               token prefix
--
-- Returns how many slots were freed.

local prefix = ARGV[1]
local freed = 0

for i = 1, #KEYS / 2 do
  local holders, details = KEYS[2 * i - 1], KEYS[2 * i]
  for _, token in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    if string.sub(token, 1, #prefix) == prefix then
      redis.call('ZREM', holders, token)
      redis.call('HDEL', details, token)
      freed = freed + 1
    end
  end
  if freed > 0 and redis.call('ZCARD', holders) == 0 then
    redis.call('DEL', holders)
  end
end
return freed
