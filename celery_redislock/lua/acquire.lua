-- Take one slot in each of N leased semaphores, all or nothing, on the server's clock.
--
-- Every semaphore is two keys in one hash slot:
--   holders  sorted set: member = holder token, score = end of that holder's lease (ms)
--   details  hash: holder token -> "acquired_ms|fence|description",
--            '#fence' -> last fencing number handed out, '#hold' -> average hold time (ms)
--
-- KEYS[2i-1], KEYS[2i]  holders and details of semaphore i
-- ARGV[1]               holder token, unique per acquisition
-- ARGV[2]               lease length (ms)
-- ARGV[3]               holder description (opaque text for operators)
-- ARGV[3+i]             slots of semaphore i
--
-- Admitted: {1, now_ms, lease_end_ms, fence_1, ..., fence_N}
-- Full:     {0, now_ms, i, holders_i, ms_until_first_lease_end_i, average_hold_ms_i}
--           for the first semaphore i that has no free slot; nothing is written.
--
-- Calling it again with a token that already holds the slots admits it again without
-- taking a second slot, so a client may safely repeat an acquire whose reply it lost.

local token = ARGV[1]
local lease = tonumber(ARGV[2])
local description = ARGV[3]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local count = #KEYS / 2

local function drop_expired(holders, details)
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  if #expired == 0 then return end
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  for first = 1, #expired, 1000 do
    redis.call('HDEL', details, unpack(expired, first, math.min(first + 999, #expired)))
  end
end

for i = 1, count do
  local holders, details = KEYS[2 * i - 1], KEYS[2 * i]
  drop_expired(holders, details)
  local slots = tonumber(ARGV[3 + i])
  if not redis.call('ZSCORE', holders, token) then
    local used = redis.call('ZCARD', holders)
    if used >= slots then
      local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
      local until_first_end = 0
      if first[2] then until_first_end = tonumber(first[2]) - now end
      local hold = tonumber(redis.call('HGET', details, '#hold') or '-1')
      return {0, now, i, used, until_first_end, hold}
    end
  end
end

local lease_end = now + lease
local reply = {1, now, lease_end}
for i = 1, count do
  local holders, details = KEYS[2 * i - 1], KEYS[2 * i]
  local fence = now_us
  local last = tonumber(redis.call('HGET', details, '#fence') or '0')
  if last >= fence then fence = last + 1 end
  local fence_text = string.format('%.0f', fence)
  redis.call('ZADD', holders, lease_end, token)
  redis.call('HSET', details, token, now .. '|' .. fence_text .. '|' .. description,
             '#fence', fence_text)
  if redis.call('PTTL', holders) < lease then
    redis.call('PEXPIRE', holders, lease)
    redis.call('PEXPIRE', details, lease)
  end
  reply[#reply + 1] = fence
end
return reply
