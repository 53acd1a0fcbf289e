-- Give back the slots one holder token has in N leased semaphores (see admit.lua).
--
-- KEYS[2i-1], KEYS[2i]  holders and details of semaphore i
-- ARGV[1]               holder token
--
-- Returns how many of the N semaphores the token was removed from: 0 when it held none
-- (already released, or its lease ran out), so releasing twice is harmless and a token
-- never frees a slot that another holder has. A semaphore left with no holder keeps only
-- its statistics (average hold time, last fencing number), for a minute; then nothing.

local token = ARGV[1]
local STATISTICS_TTL = 60000
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local released = 0

for i = 1, #KEYS / 2 do
  local holders, details = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('ZREM', holders, token) == 1 then
    released = released + 1
    local saved = redis.call('HMGET', details, token, '#hold')
    if saved[1] then
      local held = now - tonumber(string.match(saved[1], '^(%d+)|'))
      if saved[2] then held = tonumber(saved[2]) * 0.8 + held * 0.2 end
      redis.call('HDEL', details, token)
      redis.call('HSET', details, '#hold', string.format('%.0f', held))
    end
    if redis.call('ZCARD', holders) == 0 then
      redis.call('DEL', holders)
      redis.call('PEXPIRE', details, STATISTICS_TTL)
    end
  end
end
return released
