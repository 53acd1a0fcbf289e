-- Give back every slot held by members that start with a prefix, in N leased semaphores.
--
-- Holder members of task runs start "<worker node>|<task id>|", so a worker's main process
-- can free the slots of a pool child that died without running its own cleanup (prefix
-- "<node>|<task id>|"), or of its own previous life after a restart ("<node>|").
--
-- KEYS[i]   semaphore i (see admit.lua)
-- ARGV[1]   member prefix
--
-- Returns how many slots were freed.

local prefix = ARGV[1]
local freed = 0

for i = 1, #KEYS do
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[i], 0, '+inf')) do
    if string.sub(member, 1, #prefix) == prefix then
      redis.call('ZREM', KEYS[i], member)
      freed = freed + 1
    end
  end
end
return freed
