-- Moved copies that are late, not lost: the broker found each still in the queue it was
-- moved to when its backup came due (the workers are busy), and the poll asks here that
-- the slot handed over for it stay reserved, so that the copy takes it when a worker
-- gets to it instead of parking again. (units.lua and parked_names.lua are put in front.)
--
-- Per late copy (its move id) of semaphore K, one reservation of K's line is kept for
-- it: the one it was given here first (the first of K's live reservations to end that
-- was not given to another copy). That reservation's end becomes now + ARGV[1] ms, never
-- later than ARGV[2] ms after the end it had when first given (the bound: a copy that no
-- worker takes holds the slot that long at most). A copy whose reservation is gone
-- (taken by a copy, or lapsed) is given no other one. Companions of K (same hash tag):
--
--   '}:pl:'  hash, move id -> its reservation ('<n>' or '<n>*<cost>', as in '}:pv:'),
--            and '#' .. reservation -> that move id
--   '}:py:'  sorted set, '<move id> <reservation>' -> the latest end (ms) it may have
--
-- both trimmed once their bound passed (the reservation has lapsed by then).
-- KEYS the semaphores; ARGV[1] how long (ms) from now a late copy's reservation is kept,
-- ARGV[2] the most (ms) it is kept past its first end, ARGV[3..] per key in turn: how
-- many late copies it has, then their move ids.
-- Returns how many reservations were kept longer.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local step, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local TRIM, LOOK = 8, 32  -- bounds trimmed per key and call; reservations looked at

-- Forget a few copies of `key` whose bound passed.
local function trim(key, given, bounds)
  for _, entry in ipairs(redis.call('ZRANGEBYSCORE', bounds, '-inf', now, 'LIMIT', 0, TRIM)) do
    local move, member = string.match(entry, '^(%S+) (%S+)$')
    redis.call('ZREM', bounds, entry)
    redis.call('HDEL', given, move, '#' .. member)
  end
end

-- The reservation kept for copy `move` of `key` and its bound, given now if it has none.
local function reservation_of(key, move, given, bounds)
  local member = redis.call('HGET', given, move)
  if member then
    return member, tonumber(redis.call('ZSCORE', bounds, move .. ' ' .. member))
  end
  local live = redis.call('ZRANGEBYSCORE', parked_key(key, 'pv'), '(' .. now, '+inf',
                          'WITHSCORES', 'LIMIT', 0, LOOK)
  for i = 1, #live, 2 do
    if redis.call('HSETNX', given, '#' .. live[i], move) == 1 then
      local bound = tonumber(live[i + 1]) + most
      redis.call('HSET', given, move, live[i])
      redis.call('ZADD', bounds, bound, move .. ' ' .. live[i])
      for _, name in ipairs({given, bounds}) do  -- kept to the last bound, never less
        if redis.call('PTTL', name) < bound - now then redis.call('PEXPIRE', name, bound - now) end
      end
      return live[i], bound
    end
  end
  return nil, nil
end

-- Keep reservation `member` of `key` until `until_ms` if it is still live and ends before.
local function keep(key, member, until_ms)
  local ends = tonumber(redis.call('ZSCORE', parked_key(key, 'pv'), member))
  if not ends or ends <= now or ends >= until_ms then return 0 end
  local number, cost = string.match(member, '^([^*]+)%*?(%d*)$')
  redis.call('ZADD', parked_key(key, 'pv'), 'XX', until_ms, member)
  redis.call('ZADD', key, 'XX', until_ms, '~~' .. number)
  add_units(key, '~~' .. number, tonumber(cost) or 1, until_ms, 'XX')
  if redis.call('PTTL', key) < until_ms - now then  -- recorded as admit.lua reads it
    redis.call('ZADD', key, string.format('%d', 1000 - (until_ms + 60000)), '#ttl')
    redis.call('PEXPIRE', key, until_ms - now + 60000)
  end
  return 1
end

local kept, at = 0, 3
for _, key in ipairs(KEYS) do
  local given, bounds = parked_key(key, 'pl'), parked_key(key, 'py')
  trim(key, given, bounds)
  for i = 1, tonumber(ARGV[at]) do
    local move = ARGV[at + i]
    local member, bound = reservation_of(key, move, given, bounds)
    if member and bound then kept = kept + keep(key, member, math.min(now + step, bound)) end
  end
  at = at + tonumber(ARGV[at]) + 1
end
return kept
