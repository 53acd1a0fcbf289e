-- Give back every slot held by members that start with a prefix, in N leased semaphores,
-- and hand the freed slots to the waiting lines (line.lua is put in front of this script).
--
-- Holder members of task runs start "<worker node>|<task id>|", so a worker's main process
-- can free the slots of a pool child that died without running its own cleanup (prefix
-- "<node>|<task id>|"), or of its own previous life after a restart ("<node>|").
--
-- KEYS[i]   semaphore i (see admit.lua)
-- ARGV[1]   member prefix
-- ARGV[2]   how long a slot handed to a waiter stays reserved for it (ms), or 0
--
-- Returns {freed, message...}: how many slots were freed, and the messages of waiters
-- handed a slot, for the caller to re-publish.

local prefix = ARGV[1]
local reserve = tonumber(ARGV[2] or '0')
local freed = 0
local handed = {}
local now = server_now()

for i = 1, #KEYS do
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[i], 0, '+inf')) do
    if string.sub(member, 1, #prefix) == prefix then
      redis.call('ZREM', KEYS[i], member)
      freed = freed + 1
    end
  end
  serve_line(KEYS[i], now, reserve, handed)
end
local answer = {freed}
for _, message in ipairs(handed) do answer[#answer + 1] = message end
return answer
