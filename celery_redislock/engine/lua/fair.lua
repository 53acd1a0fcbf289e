-- Fair shares on a parked line (issue 29): the line of a semaphore whose limit declares
-- `fair_by` is split in sub-lines, one per key of the run ('tenant:acme'), each with its
-- own parking queue in the broker; a slot handed to the line goes to the sub-line whose
-- turn is lowest (start-time fair queuing). (This text is put in front of parking.lua.)
--
-- Companions of a semaphore K = '<prefix>{<digest>}:s:<name>' (same hash tag):
--
--   '}:ft:'  sorted set, sub-line -> its turn: the sub-lines with messages parked that no
--            move was owed for yet (only these; one ZRANGE 0 0 picks the next)
--   '}:fn:'  hash: 'v' the virtual time (the turn last served), 'w:'..sub the messages
--            parked in sub's queue no move was owed for, 'l:'..sub the turn a sub-line
--            left with (its next, had it kept waiting), 'e:'..sub when its moves began
--            to find its parking queue empty (see fair_unmove)
--   '}:fw:'  hash, sub-line -> its weight (default 1; set by an operator)
--
-- Priorities: a sub-line 'tenant\030band' (band: the run's priority, higher first) is a
-- band of its tenant ('' for a line that is not fair). The tenant's turn is as above;
-- within a tenant the band whose head has the lowest 'since - band x aging' goes first:
--
--   '}:fb:'..':'..tenant            sorted set, band -> its head's score
--   '}:fq:'..':'..tenant..'\030'..band  list of the scores of its parked copies, in order
--
-- so a run of band p is never passed by one of band q > p that started waiting more than
-- (q - p) x aging after it (earliest deadline first on since - band x aging): under a
-- steady stream of higher runs a lower one starts once (q - p) x aging has passed and
-- the higher runs older than that bound have gone (documented bound). O(log bands).
--
-- A sub-line that starts waiting takes its turn at max(virtual time, the turn it left
-- with): it earns no credit for the time it did not wait, and loses none it had. Each
-- move owed from a sub-line adds 1 / its weight to its turn. Every step is O(log n) in
-- the number of sub-lines waiting: nothing walks them.

local FAIR_TTL = 7 * 24 * 3600 * 1000
local FAIR_MARK = '\031'  -- between a key and its sub-line in a move entry
local BAND_MARK = '\030'  -- between a sub-line's tenant and its priority band

local function fair_key(key, mark)
  local at = string.find(key, '}:s:', 1, true)
  if not at then return key .. ':' .. mark end
  return string.sub(key, 1, at) .. ':' .. mark .. ':' .. string.sub(key, at + 4)
end

local function fair_keep(name)
  if redis.call('PTTL', name) < FAIR_TTL / 2 then redis.call('PEXPIRE', name, FAIR_TTL) end
end

-- The tenant and the band (nil for none) of sub-line `sub`.
local function fair_split(sub)
  local at = string.find(sub, BAND_MARK, 1, true)
  if not at then return sub, nil end
  return string.sub(sub, 1, at - 1), string.sub(sub, at + 1)
end

-- A sub-line counts one more copy parked: it joins the turns at max(virtual time, the
-- turn it left with) if it was not waiting (state and turns as fair_parked reads them).
local function fair_count(state, turns, tenant)
  if redis.call('HINCRBY', state, 'w:' .. tenant, 1) == 1 then
    local known = redis.call('HMGET', state, 'v', 'l:' .. tenant)
    local turn = math.max(tonumber(known[1] or '0') or 0, tonumber(known[2] or '0') or 0)
    redis.call('ZADD', turns, turn, tenant)
  end
  fair_keep(turns)
  fair_keep(state)
end

-- A copy of a run was refused at K and is published to sub-line `sub`'s parking queue;
-- `since` (ms) when the run started waiting, `aging` the ms worth one band.
local function fair_parked(key, sub, since, aging)
  if sub == nil or sub == '' then return end
  local tenant, band = fair_split(sub)
  local state, turns = fair_key(key, 'fn'), fair_key(key, 'ft')
  fair_count(state, turns, tenant)
  if band then
    local heads = fair_key(key, 'fb') .. ':' .. tenant
    local fifo = fair_key(key, 'fq') .. ':' .. sub
    local score = (tonumber(since) or 0) - (tonumber(band) or 0) * (tonumber(aging) or 0)
    if redis.call('RPUSH', fifo, score) == 1 then redis.call('ZADD', heads, score, band) end
    fair_keep(fifo)
    fair_keep(heads)
  end
end

-- The sub-line of `tenant` to move from: its band whose head goes first, if it has any.
local function fair_band(key, tenant)
  local heads = fair_key(key, 'fb') .. ':' .. tenant
  local top = redis.call('ZRANGE', heads, 0, 0)
  if #top == 0 then return tenant end
  local sub = tenant .. BAND_MARK .. top[1]
  local fifo = fair_key(key, 'fq') .. ':' .. sub
  redis.call('LPOP', fifo)
  local head = redis.call('LINDEX', fifo, 0)
  if head then redis.call('ZADD', heads, head, top[1]) else redis.call('ZREM', heads, top[1]) end
  return sub
end

-- A move owed from sub-line `sub` found its parking queue empty at `now`: either its
-- copy is not published yet (the refusal counted it first: a race of milliseconds), or
-- the sub-line is counted waiting with nothing parked (its copy taken by another move,
-- gone: a phantom, which must not attract later moves). Within `grace` ms of the first
-- empty move of an episode ('e:'..tenant, FAIR_EPISODE_MS long), the copy is counted
-- again at the sub-line's own turn (as a copy parked now: not first) and its band's
-- head given back; past it, what fair_moves took stays taken: a copy that still comes
-- is owed a move from the line's own queue, which the mover takes from the sub-lines
-- holding messages (line/moves.py). True if the copy was counted again.
local FAIR_EPISODE_MS = 10000
local function fair_unmove(key, sub, now, grace)
  if sub == nil or sub == '' then return false end
  local tenant, band = fair_split(sub)
  local state, turns = fair_key(key, 'fn'), fair_key(key, 'ft')
  local first = tonumber(redis.call('HGET', state, 'e:' .. tenant) or '')
  if not first or now - first > FAIR_EPISODE_MS then
    first = now
    redis.call('HSET', state, 'e:' .. tenant, now)
  end
  if now - first >= grace then  -- a phantom: dropped (its episode ends with its count)
    if redis.call('HEXISTS', state, 'w:' .. tenant) == 0 then
      redis.call('HDEL', state, 'e:' .. tenant)
    end
    fair_keep(state)
    return false
  end
  fair_count(state, turns, tenant)
  if band then
    local heads = fair_key(key, 'fb') .. ':' .. tenant
    local fifo = fair_key(key, 'fq') .. ':' .. sub
    local score = redis.call('LINDEX', fifo, 0) or '0'
    redis.call('LPUSH', fifo, score)
    redis.call('ZADD', heads, score, band)
    fair_keep(fifo)
    fair_keep(heads)
  end
  return true
end

-- A message left sub-line `sub` with no move owed from it (a move owed from the line's
-- own queue that the mover took from the sub-lines holding messages: line/moves.py):
-- the sub-line counts one copy less, if it counted any (its band's head too), so that it
-- is not left counted as waiting with nothing parked. Its turn is kept (as 'l:' once it
-- counts none). Returns 1 if a copy was counted less, else 0.
local function fair_took(key, sub)
  if sub == nil or sub == '' then return 0 end
  local tenant, band = fair_split(sub)
  local state, turns = fair_key(key, 'fn'), fair_key(key, 'ft')
  local waiting = tonumber(redis.call('HGET', state, 'w:' .. tenant) or '0') or 0
  if waiting <= 0 then return 0 end
  if waiting > 1 then
    redis.call('HINCRBY', state, 'w:' .. tenant, -1)
  else
    local turn = redis.call('ZSCORE', turns, tenant)
    redis.call('ZREM', turns, tenant)
    redis.call('HDEL', state, 'w:' .. tenant)
    if turn then redis.call('HSET', state, 'l:' .. tenant, turn) end
  end
  fair_keep(state)
  if band then
    local heads = fair_key(key, 'fb') .. ':' .. tenant
    local fifo = fair_key(key, 'fq') .. ':' .. sub
    redis.call('LPOP', fifo)
    local head = redis.call('LINDEX', fifo, 0)
    if head then redis.call('ZADD', heads, head, band) else redis.call('ZREM', heads, band) end
  end
  return 1
end

-- The moves owed to K's line, `moves` of them, appended to `out`: one '!move 1 K\031sub'
-- per move for a fair line (the sub-lines of lowest turn, in turn), the rest (a line
-- with no sub-line waiting: anonymous entries, a line that is not fair) as one
-- '!move <count> K' from K's own parking queue.
local function fair_moves(key, moves, out)
  local turns = fair_key(key, 'ft')
  local left = moves
  if redis.call('EXISTS', turns) == 1 then
    local state, weights = fair_key(key, 'fn'), fair_key(key, 'fw')
    while left > 0 do
      local first = redis.call('ZRANGE', turns, 0, 0, 'WITHSCORES')
      if #first == 0 then break end
      local sub, turn = first[1], tonumber(first[2])
      local weight = tonumber(redis.call('HGET', weights, sub) or '1') or 1
      if weight <= 0 then weight = 1 end
      local next_turn = turn + 1 / weight
      local waiting = redis.call('HINCRBY', state, 'w:' .. sub, -1)
      if waiting > 0 then
        redis.call('ZADD', turns, next_turn, sub)
        redis.call('HSET', state, 'v', turn)
      else
        redis.call('ZREM', turns, sub)
        redis.call('HDEL', state, 'w:' .. sub)
        redis.call('HSET', state, 'v', turn, 'l:' .. sub, next_turn)
      end
      fair_keep(state)  -- the HDEL above may have emptied it: written anew, no TTL
      out[#out + 1] = '!move 1 ' .. key .. FAIR_MARK .. fair_band(key, sub)
      left = left - 1
    end
  end
  if left > 0 then out[#out + 1] = '!move ' .. left .. ' ' .. key end
end
