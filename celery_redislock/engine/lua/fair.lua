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
--            left with (its next, had it kept waiting)
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

-- A copy of a run was refused at K and is published to sub-line `sub`'s parking queue;
-- `since` (ms) when the run started waiting, `aging` the ms worth one band.
local function fair_parked(key, sub, since, aging)
  if sub == nil or sub == '' then return end
  local tenant, band = fair_split(sub)
  local state, turns = fair_key(key, 'fn'), fair_key(key, 'ft')
  if redis.call('HINCRBY', state, 'w:' .. tenant, 1) == 1 then
    local known = redis.call('HMGET', state, 'v', 'l:' .. tenant)
    local turn = math.max(tonumber(known[1] or '0') or 0, tonumber(known[2] or '0') or 0)
    redis.call('ZADD', turns, turn, tenant)
    fair_keep(turns)
  end
  fair_keep(state)
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

-- A move owed from sub-line `sub` found its parking queue empty (the parked copy not
-- yet published): the sub-line gets back what fair_moves took for it, its count, its
-- turn (the current virtual time: it is served next) and its band's head (scored as
-- the band's next head, or first when none is left), so that the poll owes the move
-- again from the same queue once the copy is there.
local function fair_unmove(key, sub)
  if sub == nil or sub == '' then return end
  local tenant, band = fair_split(sub)
  local state, turns = fair_key(key, 'fn'), fair_key(key, 'ft')
  redis.call('HINCRBY', state, 'w:' .. tenant, 1)
  local virtual = tonumber(redis.call('HGET', state, 'v') or '0') or 0
  local turn = tonumber(redis.call('ZSCORE', turns, tenant) or '')
  if not turn or turn > virtual then redis.call('ZADD', turns, virtual, tenant) end
  fair_keep(turns)
  fair_keep(state)
  if band then
    local heads = fair_key(key, 'fb') .. ':' .. tenant
    local fifo = fair_key(key, 'fq') .. ':' .. sub
    local score = redis.call('LINDEX', fifo, 0) or '0'
    redis.call('LPUSH', fifo, score)
    redis.call('ZADD', heads, score, band)
    fair_keep(fifo)
    fair_keep(heads)
  end
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
