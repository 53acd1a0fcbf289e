-- Look at one holder of a semaphore: is it still there? For a redelivered message that
-- follows the earlier run of its task (see integration/earlier_run.py). (line.lua is put
-- in front of this script when it is loaded.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the holder's member ("token acquired_ms fence description")
--
-- Returns {now_ms, lease_end_ms}: lease_end_ms is the end of the holder's live lease,
-- 0 when it is gone (released, or its lease ran out), -1 when its worker freed it for a
-- run that died (release_owner.lua remembers those in the '}:l:' hash for a while).

local now = server_now()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) > now then
  return {now, tonumber(score)}
end
if redis.call('HEXISTS', companion(KEYS[1], 'l'), ARGV[1]) == 1 then
  return {now, -1}
end
return {now, 0}
