-- A rate limit's line of promised starts (rate_parked.lua: the FIFO R:pq, R's 'line'),
-- planned in the interval R:pn 'iv' (us). When the rate's interval changes at run time
-- (set-rate, clear-rate, a new configuration), the line is re-planned about now in O(1),
-- as admit_rates.lua re-plans today's promises: every start still ahead moves to
-- now + (start - now) x new / old, and so do R's 'line' (the end of the promised starts)
-- and 'tat' (what the GCRA owes). The FIFO's entries are not rewritten: R:pn 'pm' = "a b"
-- maps an entry v to the start a + b v (absent: v itself), and entries are written
-- through its inverse. Each admission still counts its start in 'tat' at the rate in
-- force: a lowered rate is never exceeded; a raised one moves the parked runs earlier.
-- (Put in front of the scripts of the parked line, after parking.lua.)

-- The map of rate key `key`'s FIFO entries to starts: {a, b}.
local function plan_map(key)
  local a, b = string.match(redis.call('HGET', parked_key(key, 'pn'), 'pm') or '',
                            '^(%S+) (%S+)$')
  return {tonumber(a) or 0, tonumber(b) or 1}
end

-- The start (us) FIFO entry `value` stands for under `map`.
local function fifo_start(map, value)
  return math.floor(map[1] + map[2] * value + 0.5)
end

-- The FIFO entry that stands for start `start` (us) under `map`.
local function fifo_entry(map, start)
  return string.format('%d', math.floor((start - map[1]) / map[2] + 0.5))
end

-- Re-plan rate key `key`'s line when its interval is no longer `interval` (us), at
-- `now_us`; true if it was.
local function replan_rate(key, interval, now_us)
  local counts = parked_key(key, 'pn')
  local saved = redis.call('HMGET', counts, 'iv', 'pm')
  local old = tonumber(saved[1] or '')
  if not old or old <= 0 or not interval or interval <= 0 or math.abs(old - interval) < 1 then
    return false
  end
  local factor, map = interval / old, plan_map(key)
  redis.call('HSET', counts, 'iv', string.format('%d', interval), 'pm',
             string.format('%.17g %.17g', now_us + (map[1] - now_us) * factor, map[2] * factor))
  local state, fields, last = redis.call('HMGET', key, 'tat', 'line'), {}, now_us
  for i, name in ipairs({'tat', 'line'}) do
    local value = tonumber(state[i] or '')
    if value and value > now_us then
      value = math.floor(now_us + (value - now_us) * factor)
      fields[#fields + 1] = name
      fields[#fields + 1] = string.format('%d', value)
      last = math.max(last, value)
    end
  end
  if #fields == 0 then return true end
  redis.call('HSET', key, unpack(fields))
  local needed = math.ceil((last - now_us) / 1000) + 1000  -- alive past its last start
  if redis.call('PTTL', key) < needed then
    redis.call('PEXPIRE', key, math.max(2 * needed, 60000))
  end
  return true
end
