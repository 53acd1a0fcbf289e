-- Pause the limits of the control hashes KEYS until a time, for a while, or for ever.
--
-- KEYS: control hashes. ARGV: mode ('for' ms | 'at' ms | 'forever'), value, keep_longer.
-- Returns {now_ms, end}: end is the pause in force on KEYS[1] afterwards ('forever' or
-- ms), or 'past' (nothing written) when the end is not after the server's now. A hash
-- that holds only a timed pause expires when the pause ends (settle_control).

local now = server_now_ms()
local value = ARGV[1]
if ARGV[1] == 'for' then
  value = string.format('%.0f', now + tonumber(ARGV[2]))
elseif ARGV[1] == 'at' then
  value = string.format('%.0f', tonumber(ARGV[2]))
end
if value ~= 'forever' and tonumber(value) <= now then return {now, 'past'} end
local result = nil
for _, key in ipairs(KEYS) do
  local current = redis.call('HGET', key, 'paused_until')
  local keep = false
  if ARGV[3] == '1' and current then
    if current == 'forever' then
      keep = true
    elseif value ~= 'forever' and tonumber(current) and tonumber(current) >= tonumber(value) then
      keep = true
    end
  end
  if not keep then redis.call('HSET', key, 'paused_until', value) end
  settle_control(key, now)
  if not result then result = keep and current or value end
end
return {now, result}
