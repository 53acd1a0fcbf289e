-- A standby (engine/standby.py, gate/standby.py): the line's next run moved ahead to a
-- worker and held in its main process with no slot, its reference claimed by the
-- token of its ask; when a run of the same key ends in that worker, that run's slot
-- goes to the standby in one call, and the next standby is owed. Put in front of
-- admit_parked.lua, after parked_args.lua, for the standby's admission only
-- (engine/standby.py's STANDBY_ADMIT, after standby_owe.lua): one semaphore of cost 1, no rate.
--
-- ARGV[14+3N]  '?' : a moved copy that would park again at its home is held as a
--              standby instead (its reference claimed by ARGV[1], the claim lapsing
--              after STANDBY_MS: a worker killed with it loses nothing, the copy the
--              broker gives back asks as any moved copy); answered as parked (status 7)
--              under '=' .. its park id, and nothing is published;
--              '? <member>': first, the holder <member> of KEYS[1] (a run of this key
--              that ended in the asking worker) gives its slot to this copy: removed,
--              its claim served (as release.lua), the slot reserved for the line, which
--              this copy (at its home) then takes; and one move is owed with no slot
--              reserved, the next standby. A member no longer held changes nothing:
--              the copy asks as any moved copy (and may be held again).

local STANDBY_MS = 30000
local standby_arg = (N == 1 and R == 0) and ARGV[14 + 3 * N] or nil
local standby_welcome = standby_arg ~= nil and string.sub(standby_arg, 1, 1) == '?'
local standby_from = standby_arg and string.match(standby_arg, '^%? (.+)$')

-- Holder `member` of `key`, if live, gives its slot to the copy asking: removed, its
-- claim served, the slot reserved for the line (this copy takes it), a standby owed.
local function standby_swap(key, member)
  local score = redis.call('ZSCORE', key, member)
  if not score or tonumber(score) <= now then return false end
  serve_claim(key, token_of(member), now)
  redis.call('ZREM', key, member)
  local number = redis.call('HINCRBY', parked_key(key, 'pn'), 'v', 1)
  local until_ms = string.format('%d', now + math.max(reserve, 1000))
  redis.call('ZADD', key, until_ms, PARKED_RESERVED .. number)
  redis.call('ZADD', parked_key(key, 'pv'), until_ms, number)
  keep_parked(parked_key(key, 'pv'))
  standby_owe(key, now, handed)
  return true
end

if standby_from then standby_swap(KEYS[1], standby_from) end

-- The copy at `l`, its home, held as a standby: its reference claimed by this ask's
-- token until STANDBY_MS from now. False when it may not be (not a moved copy of this
-- park id, a live claim, a grace, a pause, a cost, a max wait).
local function standby_hold(l)
  local ref = l.ref
  if not (ref and ref.park_id == park_id and (ref.state == 'w' or ref.state == 'c'))
      or grace or l.paused or l.cost ~= 1 or max_wait or claimed_live(l, now) then
    return false
  end
  if ref.state == 'w' then count_down_waiting(l.key, l.counts) end
  if ref.state == 'c' then claim_until(l.key, ref.holder, nil) end
  write_ref(l.key, run, 'c', ref.since, ref.park_id, token, '', copy)
  redis.call('HSET', parked_key(l.key, 'pc'), token, run)
  keep_parked(parked_key(l.key, 'pc'))
  claim_until(l.key, token, now + STANDBY_MS)
  return true
end

-- admit_parked.lua's park, for a copy that may be held as a standby at its home.
local park_plainly = park
local function park(i)  -- luacheck: ignore (shadows parked_args.lua's on purpose)
  if standby_welcome and i == home and park_id ~= '' and standby_hold(limiters[i]) then
    local used, until_first_end, hold = refusal_fields(limiters[i], now, grace)
    return reply(7, i, used, until_first_end, hold, '=' .. park_id)
  end
  return park_plainly(i)
end
