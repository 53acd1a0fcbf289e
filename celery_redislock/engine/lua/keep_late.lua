-- Moved copies that are late, not lost: the broker found each still in the queue it was
-- moved to when its backup came due (the workers are busy), a queue some running worker
-- consumes, and the poll asks here that the slot handed over for it stay reserved, so
-- that the copy takes it when a worker gets to it instead of parking again. (units.lua
-- and parked_names.lua are put in front.)
--
-- Per late copy (its move id) of semaphore K, one live reservation of K's line is tied
-- to it: the one it was tied to before while that is live, else the first of K's live
-- reservations to end that no other copy looked at within ARGV[1] ms holds. Its end
-- becomes now + ARGV[1] ms: while the broker keeps seeing the copy in its queue, it
-- holds its key's turn however long it waits, and K's slot is not handed on. A copy a
-- worker received takes the reservation tied to it and is forgotten here at once
-- (parking.lua's take_reservation); once no look names a copy (lost and put back), its
-- reservation lapses ARGV[1] ms after the last look. A copy only presumed there (a move
-- id written '~<id>': its queue was too long to look in, see restore.lua) is kept no
-- later than ARGV[2] ms after it was last seen (or first named): a copy lost from a
-- queue that stays long holds the slot that long at most. Companions of K (same hash
-- tag):
--
--   '}:pl:'  hash, move id -> its reservation ('<n>' or '<n>*<cost>', as in '}:pv:'),
--            '#' .. reservation -> that move id, '@' .. move id -> the latest end (ms)
--            a look that only presumes the copy may keep
--   '}:py:'  sorted set, move id -> its last look (ms); forgotten ARGV[1] ms after
--
-- A slot of K freed while a copy seen lately holds no live reservation (one that lapsed
-- before its first look: a move made long after its hand-over) is reserved for it, not
-- handed to the next run (parking.lua's reserve_for_late).
--
-- KEYS the semaphores; ARGV[1] how long (ms) from now a late copy's reservation is kept,
-- ARGV[2] the most (ms) it is kept while only presumed, ARGV[3..] per key in turn: how
-- many late copies it has, then their move ids.
-- Returns how many reservations were kept longer.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local step, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local TRIM, LOOK = 8, 32  -- copies forgotten per key and call; reservations looked at

-- Untie copy `move` from reservation `member`.
local function untie(move, member, given)
  redis.call('HDEL', given, move)
  if redis.call('HGET', given, '#' .. member) == move then
    redis.call('HDEL', given, '#' .. member)
  end
end

-- Forget a few copies of `key` no look named for `step` ms (their reservations lapsed).
local function trim(given, looks)
  local old = redis.call('ZRANGEBYSCORE', looks, '-inf', now - step, 'LIMIT', 0, TRIM)
  for _, entry in ipairs(old) do
    local move = string.match(entry, '^(%S+)')  -- ('<move> <reservation>': an older form)
    local member = redis.call('HGET', given, move)
    redis.call('ZREM', looks, entry)
    redis.call('HDEL', given, '@' .. move)
    if member then untie(move, member, given) end
  end
end

local function live(key, member)
  local ends = tonumber(redis.call('ZSCORE', parked_key(key, 'pv'), member))
  return ends ~= nil and ends > now
end

-- Tie copy `move` of `key` to a live reservation no other copy looked at holds.
local function tie(key, move, given, looks)
  local found = redis.call('ZRANGEBYSCORE', parked_key(key, 'pv'), '(' .. now, '+inf',
                           'LIMIT', 0, LOOK)
  for _, member in ipairs(found) do
    local holder = redis.call('HGET', given, '#' .. member)
    local held = holder and holder ~= move and
      (tonumber(redis.call('ZSCORE', looks, holder)) or 0) > now - step
    if not held then
      redis.call('HSET', given, '#' .. member, move, move, member)
      return member
    end
  end
  return nil
end

-- The reservation of `key` copy `move` holds: its tie while live, else tied anew.
local function reservation_of(key, move, given, looks)
  local member = redis.call('HGET', given, move)
  if member and live(key, member) then return member end
  if member then untie(move, member, given) end  -- taken by another copy, or lapsed
  return tie(key, move, given, looks)
end

-- How long copy `move` may be kept now: `step` from now; while only presumed in its
-- queue, no later than `most` after it was last seen (or first named).
local function keep_until(move, presumed, given)
  if not presumed then
    redis.call('HSET', given, '@' .. move, now + most)
    return now + step
  end
  local bound = tonumber(redis.call('HGET', given, '@' .. move))
  if not bound then
    bound = now + most
    redis.call('HSET', given, '@' .. move, bound)
  end
  return math.min(now + step, bound)
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
  local given, looks = parked_key(key, 'pl'), parked_key(key, 'py')
  trim(given, looks)
  for i = 1, tonumber(ARGV[at]) do
    local presumed = string.sub(ARGV[at + i], 1, 1) == '~'
    local move = presumed and string.sub(ARGV[at + i], 2) or ARGV[at + i]
    local until_ms = keep_until(move, presumed, given)
    redis.call('ZADD', looks, now, move)
    if until_ms > now then
      local member = reservation_of(key, move, given, looks)
      if member then kept = kept + keep(key, member, until_ms) end
    else  -- presumed past its bound: it holds nothing
      local member = redis.call('HGET', given, move)
      if member then untie(move, member, given) end
    end
  end
  for _, name in ipairs({given, looks}) do  -- kept as long as its copies' bounds
    if redis.call('PTTL', name) < most + step then redis.call('PEXPIRE', name, most + step) end
  end
  at = at + tonumber(ARGV[at]) + 1
end
return kept
