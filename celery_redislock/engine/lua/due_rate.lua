-- The poll of the rate limiters' parked lines (each worker, every ~200 ms): for each rate
-- key, the line is re-planned if an operator set the rate at run time (rate_plan.lua);
-- the parked copies whose promised start is due within the lead are owed a move out
-- of its parking queue (the heads of its FIFO of promised starts, rate_parked.lua); a
-- parking queue that holds messages its FIFO does not know (the store lost its data, or
-- copies were parked twice) for a while is given that many starts at the end of the
-- line; the runs parked while the rate was paused are promised starts once it ends; and
-- a deadline move is owed per run parked past its max wait (deadline.lua: '!late').
-- (store.lua, units.lua, fair.lua, parking.lua and line.lua are put in front.)
--
-- KEYS[i]     rate key i (1..N); KEYS[N+1] the index of rate keys with a parked line
-- ARGV[1]     the lead (us): a head promised before now + lead is due
-- ARGV[2]     the most moves owed per key and call
-- ARGV[2+i]   how many messages rate key i's parking queue holds (-1: unknown)
--
-- Returns {0, move...}: '!move <count> <key>' and '!late <count> <key>' entries (see
-- parking.lua, deadline.lua). Each call reads and pops O(moves) entries: nothing walks
-- the line.

local STALE_MS = 2000
local N = #KEYS - 1
local lead, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, now_us = server_now()
local out = {0}

-- Promise `n` runs of rate key `key` the next starts at the end of its line (one each
-- `interval` us), at the tail of its FIFO `fifo`.
local function promise_starts(key, fifo, n, interval)
  local line = math.max(tonumber(redis.call('HGET', key, 'line') or '0') or 0, now_us)
  local promises, map = {'RPUSH', fifo}, plan_map(key)
  for _ = 1, n do
    promises[#promises + 1] = fifo_entry(map, line)
    line = line + interval
  end
  redis.call(unpack(promises))
  keep_parked(fifo)
  redis.call('HSET', key, 'line', string.format('%d', line))
  local needed = math.ceil((line - now_us) / 1000) + 1000
  if redis.call('PTTL', key) < needed then redis.call('PEXPIRE', key, 2 * needed) end
end

for i = 1, N do
  local key = KEYS[i]
  local length = tonumber(ARGV[2 + i]) or -1
  local fifo, counts = parked_key(key, 'pq'), parked_key(key, 'pn')
  local control = redis.call('HMGET', string.gsub(key, '}:r:', '}:cr:', 1), 'paused_until',
                             'interval')
  replan_rate(key, tonumber(control[2] or ''), now_us)  -- set-rate (rate_plan.lua)
  local interval = tonumber(redis.call('HGET', counts, 'iv') or '') or 0
  if interval <= 0 then interval = 1000000 end  -- never parked here: a start a second
  local held = tonumber(redis.call('HGET', counts, 'p') or '0') or 0
  local pause = control[1]
  if held > 0 and not pause_end(pause, now) then
    -- A pause ended: the runs parked during it are promised the starts at the line's end.
    local n = math.min(held, 1000)
    promise_starts(key, fifo, n, interval)
    redis.call('HINCRBY', counts, 'p', -n)
    held = held - n
  end
  local heads, map = redis.call('LRANGE', fifo, 0, most - 1), plan_map(key)
  local due = 0
  for _, head in ipairs(heads) do
    if fifo_start(map, tonumber(head)) > now_us + lead then break end
    due = due + 1
  end
  if due > 0 then
    redis.call('LTRIM', fifo, due, -1)
    out[#out + 1] = '!move ' .. due .. ' ' .. key
  end
  deadline_moves(key, now, out)
  local waiting = redis.call('LLEN', fifo) + held
  if waiting == held then redis.call('HDEL', counts, 'pm') end  -- no entry to map
  local seen = tonumber(redis.call('HGET', counts, 'e') or '')
  if length > waiting and due == 0 then
    -- Messages no promise stands for: seen so for STALE_MS, they are promised starts at
    -- the end of the line (each moved copy then asks as a newcomer, or is stale).
    if not seen then
      redis.call('HSET', counts, 'e', now)
      keep_parked(counts)
    elseif now - seen > STALE_MS then
      promise_starts(key, fifo, math.min(length - waiting, 1000), interval)
      redis.call('HDEL', counts, 'e')
      redis.call('ZADD', KEYS[N + 1], now, key)
      keep_parked(KEYS[N + 1])  -- the index lives as long as the lines it names
    end
  elseif seen then
    redis.call('HDEL', counts, 'e')
  end
  if waiting == 0 and length == 0 then redis.call('ZREM', KEYS[N + 1], key) end
end
return out
