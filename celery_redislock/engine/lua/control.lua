-- Shared by the scripts that write an operator's control hash (':cs:' of a semaphore,
-- ':cr:' of a rate limiter), whose fields are 'slots' (set-slots), 'rate' and 'interval'
-- (set-rate) and 'paused_until' (pause: ms on the server's clock, or 'forever').
--
-- settle_control(key, now) gives the hash the lifetime its fields call for: a pause that
-- has ended is removed; a hash holding only a pause with an end expires at that end; a
-- hash holding an override or a pause for ever lasts (no TTL) until clear-slots,
-- clear-rate or resume. A lasting hash that had a TTL (a timed pause, then an override)
-- is written again without it (HDEL of every field drops the key and its TTL).

local CONTROL_FIELDS = {'slots', 'rate', 'interval', 'paused_until'}

-- A pause further off than this (ms, about 3000 years) is kept as one for ever (no TTL).
local LONGEST_TTL = 1e14

local function settle_control(key, now)
  local values = redis.call('HMGET', key, unpack(CONTROL_FIELDS))
  local ends = tonumber(values[4])
  if ends and ends <= now then
    redis.call('HDEL', key, 'paused_until')
    values[4], ends = false, nil
  end
  local expires = ends and ends - now < LONGEST_TTL
  local lasting = values[1] or values[2] or values[3] or (values[4] and not expires)
  if not lasting then
    if expires then redis.call('PEXPIRE', key, string.format('%.0f', ends - now)) end
    return
  end
  if redis.call('PTTL', key) < 0 then return end
  local kept = {}
  for i, name in ipairs(CONTROL_FIELDS) do
    if values[i] then
      kept[#kept + 1] = name
      kept[#kept + 1] = values[i]
    end
  end
  redis.call('HDEL', key, unpack(CONTROL_FIELDS))
  redis.call('HSET', key, unpack(kept))
end

local function server_now_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end
