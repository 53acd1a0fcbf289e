-- The next standby (standby.lua): one move owed out of a semaphore's parked line with no
-- slot reserved for it, if a message no move was owed for is parked there (a fair
-- line's: from the sub-line whose turn it is, as a release's move). Put in front of
-- standby.lua, standby_ask.lua and standby_claim.lua, after parking.lua and fair.lua.

-- One move owed out of `key`'s line with no slot reserved (at `now`), appended to `out`.
-- A fair line with no sub-line waiting owes none: each message parked there is owed a
-- move already, and a move from the line's own queue would take one of them a second
-- time (its sub-line's move would then find its queue empty and keep its count: a
-- sub-line counted as waiting with nothing parked, served next for ever).
local function standby_owe(key, now, out)
  if redis.call('EXISTS', fair_key(key, 'ft')) == 1 then return fair_moves(key, 1, out) end
  if redis.call('EXISTS', fair_key(key, 'fn')) == 1 then return end
  local counts = parked_line(key)
  if counts and counts[1] + counts[2] - live_reservations(key, now) > 0 then
    out[#out + 1] = '!move 1 ' .. key
  end
end
