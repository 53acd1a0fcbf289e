-- The parked line of a semaphore: a refused run waits as ONE message in a parking queue
-- of the broker that no worker consumes; the lock store keeps only references to it, and
-- counts. Shared by the scripts that admit, release, hand over and poll. (This text is
-- put in front of those scripts, after fair.lua and parked_names.lua, which names the
-- companions below, and before parked_claims.lua (the claims of its references) and
-- line.lua; see scripts.py.)
--
-- A semaphore K = '<prefix>{<digest>}:s:<name>' has these companions (same hash tag):
--
--   '}:pn:'  hash, the line's counts: 'w' references waiting, 'a' anonymous entries
--            (parked messages counted from the broker after the store lost its data),
--            'n' the last park number, 'k' how long a served reference is kept (ms),
--            's' the configured number of slots (for a hand-over once K's '#slots' is
--            gone), 'v' the last reservation number, 'e' since when the poll saw the
--            parking queue empty while references waited, 'i' the incarnation in which
--            the poll last counted the parking queue (due.lua)
--   '}:pr:'  hash, run ('<task id>:<attempt>') -> its reference 'state since park_id
--            holder [again [copy]]': state 'w' waiting (its copy parked as park_id), 'c'
--            claimed by the holder token (a moved copy took a slot; its body has not
--            started, or acks late and has not ended; 'again' ('a', '-' for none): a copy
--            of the run went back to parking while the claim was live, see
--            claimed_again; 'copy': the claiming copy's id, acks late), 's' served (kept
--            'k' ms, then forgotten; written as 's' alone, or 's since copy' when the copy
--            that ran acks late: that very copy, redelivered, runs again, see rerun_ref)
--   '}:pc:'  hash, holder token -> the run whose reference it claimed (a live claim)
--   '}:pe:'  sorted set, the claims' ends: holder token -> the end of its lease (ms;
--            renew.lua and adopt.lua move it with the lease: claim_moves), and '<token> <run>' -> when
--            the reference of a claim that lapsed is forgotten (ms; see lapse_claims)
--   '}:px:'  list of 'when run': when (ms) each served reference is forgotten, in the
--            order they were served (a list costs less per entry than a sorted set)
--   '}:pv:'  sorted set, reservation number -> its end (ms); the reservation itself is
--            the member '~~' .. number of K, scored the same: it counts as a holder
--
-- and the key space's index '<prefix>parked' (sorted set, K -> when a run last parked;
-- kept PARKED_TTL from a park, as the companions are).
-- Every operation reads and writes O(1) entries (O(log n) in a sorted set): nothing
-- walks the line, which may hold 100,000 references. A park id is '<incarnation>:<n>'.

local PARKED_TTL = 7 * 24 * 3600 * 1000
local PRUNE_SERVED = 8
local LAPSE_CLAIMS = 8
local PARKED_RESERVED = '~~'

-- The key space's index of parked lines, or nil for a key with no hash tag.
local function parked_index(key)
  local at = string.find(key, '{', 1, true)
  if not at then return nil end
  return string.sub(key, 1, at - 1) .. 'parked'
end

-- Keep companion `name` alive PARKED_TTL (set when less than half of it is left).
local function keep_parked(name)
  if redis.call('PTTL', name) < PARKED_TTL / 2 then redis.call('PEXPIRE', name, PARKED_TTL) end
end

-- Mark semaphore `key` contended ('#hold', see admit.lua): its releases hand over. A
-- semaphore that did not exist (no holder) is given the minute of life admit.lua gives.
local function mark_parked(key, now)
  if redis.call('ZADD', key, 'NX', -0.5, '#hold') == 1 and redis.call('PTTL', key) < 0 then
    redis.call('ZADD', key, string.format('%d', 1000 - (now + 60000)), '#ttl')
    redis.call('PEXPIRE', key, 60000)
  end
end

-- {state, since, park_id, holder, again, copy} of a reference's text, or nil. A served
-- reference is kept as 's' alone (it ends every copy of its run, whatever its park id),
-- or as 's since copy' (acks late: the copy that ran, given back, runs again).
local function parse_ref(text)
  if not text then return nil end
  if text == 's' then
    return {state = 's', since = '', park_id = '', holder = '', again = '', copy = ''}
  end
  local since, copy = string.match(text, '^s (%S+) (%S+)$')
  if copy then
    return {state = 's', since = since, park_id = '', holder = '', again = '', copy = copy}
  end
  local state, park_id, holder, again
  state, since, park_id, holder, again, copy =
    string.match(text, '^(%S+) (%S+) (%S*) ?(%S*) ?(%S*) ?(%S*)$')
  return {state = state, since = since, park_id = park_id, holder = holder or '',
          again = (again ~= '-' and again) or '', copy = copy or ''}
end

local function write_ref(key, run, state, since, park_id, holder, again, copy)
  local refs = parked_key(key, 'pr')
  local text = 's'
  copy = copy or ''
  if state == 's' and copy ~= '' then
    text = 's ' .. (since ~= '' and since or '0') .. ' ' .. copy
  elseif state ~= 's' then
    text = state .. ' ' .. since .. ' ' .. park_id .. ' ' .. holder
    if (again and again ~= '') or copy ~= '' then
      text = text .. ' ' .. ((again and again ~= '') and again or '-')
    end
    if copy ~= '' then text = text .. ' ' .. copy end
  end
  redis.call('HSET', refs, run, text)
  keep_parked(refs)
end

-- The counts of the parked line of `key`: {waiting, anonymous, configured slots, since
-- when its parking queue was seen empty while references waited, the incarnation its
-- parking queue was last counted in (see due.lua)}, or nil when it has none.
local function parked_line(key)
  local counts = redis.call('HMGET', parked_key(key, 'pn'), 'w', 'a', 's', 'e', 'i')
  if not (counts[1] or counts[2]) then return nil end
  return {tonumber(counts[1] or '0') or 0, tonumber(counts[2] or '0') or 0, tonumber(counts[3]),
          tonumber(counts[4]), counts[5]}
end

-- One reference of `key` less waiting (`counts` as parked_line read them): the count
-- never goes below 0 (the poll may have set it to 0, see due.lua).
local function count_down_waiting(key, counts)
  if counts[1] > 0 then
    redis.call('HINCRBY', parked_key(key, 'pn'), 'w', -1)
    counts[1] = counts[1] - 1
  end
end

-- Forget a few served references whose time ran out.
local function prune_served(key, now)
  local served = parked_key(key, 'px')
  for _ = 1, PRUNE_SERVED do
    local head = redis.call('LINDEX', served, 0)
    if not head then return end
    local at = string.find(head, ' ', 1, true)
    if tonumber(string.sub(head, 1, at - 1)) > now then return end
    redis.call('LPOP', served)
    local refs, run = parked_key(key, 'pr'), string.sub(head, at + 1)
    local text = redis.call('HGET', refs, run)  -- not a reference written again since
    if text and string.match(text, '^[sb]') then redis.call('HDEL', refs, run) end
  end
end

-- How many reservations of `key` are live (those that ran out are dropped).
local function live_reservations(key, now)
  local reservations = parked_key(key, 'pv')
  redis.call('ZREMRANGEBYSCORE', reservations, '-inf', now)
  return redis.call('ZCARD', reservations)
end

-- Forget moved copy `move` of `key` as a late copy (keep_late.lua's '}:pl:' and
-- '}:py:'): it was received, so it is no longer queued, and a slot of `key` freed now is
-- not reserved for it (reserve_for_late). Returns the reservation it was tied to, or nil.
local function forget_late(key, move)
  local given = parked_key(key, 'pl')
  if not move or move == '' or redis.call('EXISTS', given) == 0 then return nil end
  local member = redis.call('HGET', given, move)
  redis.call('ZREM', parked_key(key, 'py'), move)
  redis.call('HDEL', given, move, '@' .. move)
  if member and redis.call('HGET', given, '#' .. member) == move then
    redis.call('HDEL', given, '#' .. member)
  end
  return member
end

-- Take a live reservation of `key`: the one late copy `move` (a moved copy's id, or nil)
-- was tied to if it is live, else the one that ends first; `move` is forgotten as a late
-- copy (forget_late). Its cost (parked_cost.lua) if there was one, else false.
local function take_reservation(key, now, move)
  local reservations = parked_key(key, 'pv')
  local tied = forget_late(key, move)
  local first = {tied}
  if not (tied and (tonumber(redis.call('ZSCORE', reservations, tied)) or 0) > now) then
    first = redis.call('ZRANGEBYSCORE', reservations, '(' .. now, '+inf', 'LIMIT', 0, 1)
  end
  if #first == 0 then return false end
  redis.call('ZREM', reservations, first[1])
  local cost, number = reservation_cost(first[1])
  redis.call('ZREM', key, PARKED_RESERVED .. number)
  remove_units(key, PARKED_RESERVED .. number, cost)
  return cost
end

-- Record that `key` (a semaphore) lives at least `reserve_ms` more, as admit.lua reads it.
local function live_at_least(key, now, reserve_ms)
  if redis.call('PTTL', key) < reserve_ms then  -- recorded as admit.lua reads it ('#ttl')
    redis.call('ZADD', key, string.format('%d', 1000 - (now + reserve_ms + 60000)), '#ttl')
    redis.call('PEXPIRE', key, reserve_ms + 60000)
  end
end

-- How long (ms) after its last look a late copy (keep_late.lua) still has its key's turn.
local LATE_SEEN_MS = 4000

-- Reserve `free` slots of `key` (of one unit: not on a weighted line) for its late copies
-- that hold no live reservation, seen in their queue within LATE_SEEN_MS and within
-- their bound (keep_late.lua's '}:pl:' and '}:py:'), each tied to its copy, instead of
-- moving another run: the key's turn is theirs. Returns the slots left free.
local function reserve_for_late(key, free, now, reserve_ms)
  local looks, given = parked_key(key, 'py'), parked_key(key, 'pl')
  if free <= 0 or redis.call('EXISTS', looks) == 0 or redis.call('EXISTS', cost_fifo(key)) == 1 then
    return free
  end
  local until_ms = now + reserve_ms
  for _, move in ipairs(redis.call('ZRANGEBYSCORE', looks, now - LATE_SEEN_MS, '+inf',
                                   'LIMIT', 0, free + 8)) do
    local member = redis.call('HGET', given, move)
    local ends = member and tonumber(redis.call('ZSCORE', parked_key(key, 'pv'), member))
    local bound = tonumber(redis.call('HGET', given, '@' .. move)) or 0
    if not string.find(move, ' ', 1, true) and not (ends and ends > now) and bound > now then
      local number = redis.call('HINCRBY', parked_key(key, 'pn'), 'v', 1)
      redis.call('ZADD', key, until_ms, PARKED_RESERVED .. number)
      redis.call('ZADD', parked_key(key, 'pv'), until_ms, number)
      add_units(key, PARKED_RESERVED .. number, 1, until_ms)
      if member then redis.call('HDEL', given, '#' .. member) end
      redis.call('HSET', given, move, number, '#' .. number, move)
      free = free - 1
      if free <= 0 then break end
    end
  end
  keep_parked(parked_key(key, 'pv'))
  live_at_least(key, now, reserve_ms)
  return free
end

-- Reserve for the parked line of `key` as many of its `free` slots as it has waiters
-- with no reservation yet (waiting references and anonymous entries, less the live
-- reservations), each until now + reserve_ms, its late copies' first
-- (reserve_for_late); the moves owed out of its parking queue are appended to `out` as
-- one entry '!move <count> <key>'. Returns the slots left free.
local function hand_over_parked(key, free, now, reserve_ms, out, counts)
  counts = counts or parked_line(key)
  if not counts or free <= 0 or reserve_ms <= 0 then return free end
  free = reserve_for_late(key, free, now, reserve_ms)
  local costs = parked_costs(key, free, counts[1] + counts[2] - live_reservations(key, now))
  local moves = #costs
  if moves <= 0 then return free end
  local last = redis.call('HINCRBY', parked_key(key, 'pn'), 'v', moves)
  local until_ms = now + reserve_ms
  local members, numbers = {'ZADD', key}, {'ZADD', parked_key(key, 'pv')}
  for index, cost in ipairs(costs) do  -- a weighted head: its units too (parked_cost.lua)
    local number = last - moves + index
    members[#members + 1] = until_ms
    members[#members + 1] = PARKED_RESERVED .. number
    numbers[#numbers + 1] = until_ms
    numbers[#numbers + 1] = cost > 1 and (number .. '*' .. cost) or number
    add_units(key, PARKED_RESERVED .. number, cost, until_ms)
    free = free - cost + 1
  end
  redis.call(unpack(members))
  redis.call(unpack(numbers))
  keep_parked(parked_key(key, 'pv'))
  live_at_least(key, now, reserve_ms)
  fair_moves(key, moves, out)  -- from the sub-lines in turn, if fair (fair.lua)
  return free - moves
end
