-- Admit one run past N semaphores on the parked line (parking.lua), all or nothing, on
-- the server's clock; a refusal writes the run's reference in the same call (it parks).
-- (store.lua, units.lua, fair.lua, parked_cost.lua, parking.lua, deadline.lua, line.lua
-- parked_admit.lua and parked_rates.lua are put in front of this script.)
-- Semaphores of any cost (units.lua, parked_cost.lua), and rate limits of any cost
-- (parked_rates.lua: their keys and arguments follow); the holders are admit.lua's
-- ("token acquired_ms fence description" scored by the end of the lease), so renew,
-- adopt and release work as ever.
--
-- KEYS[i]      semaphore i (1..N); KEYS[N+1] the key space's index of parked lines
-- ARGV[1]      holder token        ARGV[2] lease (ms)        ARGV[3] holder description
-- ARGV[4]      the run: '<task id>:<attempt>'
-- ARGV[5]      home: i of the semaphore whose parking queue this copy was moved out of,
--              0 for a copy never parked
-- ARGV[6]      its park id ('' for none), then ' ' and the copy's id
--              (a moved copy's: see parked_admit.lua's rerun_ref)
-- ARGV[7]      how long a served reference is kept (ms): the broker's visibility timeout
-- ARGV[8]      how long a slot handed to the line stays reserved (ms)
-- ARGV[8+i]    the configured slots of semaphore i
-- ARGV[9+N]    the latest incarnation the caller saw (admit.lua; -1: Redis Cluster)
-- ARGV[10+N]   the longest lease (ms) the caller's process knows of (store.lua)
-- ARGV[11+N]   '1': a paused semaphore parks the run (status 7, its pause's end as the
--              wait, -1 for none) rather than refusing it (status 3); the poll hands
--              its slots over once the pause ends
-- ARGV[11+N+i] the run's sub-line at semaphore i, for a fair line ('' or missing: none;
--              fair.lua): a copy parked there goes to that sub-line's parking queue
-- ARGV[12+2N]  the run's max wait (ms; '' or missing: none): a run parked that long is
--              given up (status 5; deadline.lua)
-- ARGV[13+2N]  how many ms of waiting are worth one step of priority (sub-lines with a
--              band; fair.lua)
-- ARGV[13+2N+i] the run's cost at semaphore i (missing: 1): it takes that many units,
--              and a reservation of its line is made in units of its head's cost
--              (parked_cost.lua)
--
-- Each semaphore decides in turn, a moved copy's home first (the first that refuses
-- parks the run):
--   * the home of a moved copy: a reference that does not name this park id (or is
--     served, unless served to this very copy under acks late: rerun_ref) makes the
--     copy stale (status 4); one claimed by a live holder sends it back
--     to parking unchanged (status 7, the same park id); else it takes a live
--     reservation if there is one (not in the grace); a copy parked in an incarnation
--     the store lost (its park id's) counts down an anonymous entry and does the same
--   * else as a newcomer: served -> status 4; claimed by a live holder -> status 7, its
--     park id; a free slot and nobody else waiting (not in the grace) -> it passes (a
--     copy that took its home's reservation needs only a slot no body holds: free, or
--     reserved for that line, which it takes); else it parks: its reference (new park
--     id, its first 'since' kept) is written, status 7.
-- A moved copy that takes no reservation at its home gives one back (it was moved for
-- it), and the slot is handed over again: '!move' entries follow the reply's fields.
-- Replies, as admit.lua's: "now_ms lease_end_ms fence contended last" admitted;
--   {1, now, 0, lease_end, fence, contended, last, moves...} admitted
--   {7, now, i, holders, ms_until_first_lease_end, average_hold_ms, park_id, moves...}
--        parked at semaphore i under park_id: publish the copy to its parking queue
--   {3, now, i, pause_end_ms or -1, 0, 0, 0}   semaphore i is paused
--   {4, now, i, 0, 0, 0, 0, moves...}          stale or served: end this copy unrun
--   {5, now, i, since, 0, 0, 0, moves...}      given up at semaphore (or rate) i: it
--        waited its max wait since `since` (ms); its reference is dropped, nothing held

local R = 0  -- rate keys (parked_rates.lua): '...}:r:...', after KEYS[N+1]
for _, key in ipairs(KEYS) do R = R + (string.find(key, '}:r:', 1, true) and 1 or 0) end
local N = #KEYS - 1 - (R > 0 and R + 1 or 0)
local token, lease, description, run = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local home = tonumber(ARGV[5]) or 0
local park_id, copy = string.match(ARGV[6], '^(%S*) ?(%S*)$')
local keep, reserve = tonumber(ARGV[7]), tonumber(ARGV[8])
local seen = tonumber(ARGV[9 + N] or '0') or 0
local bound = math.max(lease, tonumber(ARGV[10 + N] or '0') or 0)
local park_paused = ARGV[11 + N] == '1'
local max_wait = tonumber(ARGV[12 + 2 * N] or '')
local deadline_move = false  -- this copy was moved for a deadline (deadline.lua)
local now, now_us = server_now()
local now_text = string.format('%d', now)
local handed = {}

local function reply(status, i, a, b, c, d)
  local answer = {status, now, i, a, b, c, d}
  for _, entry in ipairs(handed) do answer[#answer + 1] = entry end
  return answer
end

-- The incarnation (its 'born', '0' on Redis Cluster), and the end of its grace, if on.
local born, grace = '0', nil
local marker = incarnation_key(KEYS[1])
if marker and seen >= 0 then
  local state = incarnation_for(marker, now, now_us, seen, bound)
  if state then
    born = string.format('%d', state[1])
    if state[2] > now then grace = state[2] end
  end
end

-- Phase 1: read every semaphore.
local limiters = {}
for i = 1, N do
  local l = read_semaphore(KEYS[i], ARGV[8 + i], cost_of(13 + 2 * N, i), run, now)
  if l.paused and not park_paused then return reply(3, i, l.paused, 0, 0, 0) end
  rerun_ref(l, copy, park_id)
  limiters[i] = l
end
local rates = read_rates(N + 2, R, 14 + 3 * N, run, now, now_us, copy)
local home_rate = home > N + 1 and home - N - 1 or 0
local promised = rate_turn(rates, home_rate, park_id)  -- a turn at the rates
if promised == 'stale' then return reply(4, N + math.max(home_rate, 1), 0, 0, 0, 0) end
local late = promised and rate_late(rates, home_rate, run, max_wait, keep, now, now_us)
if late then return reply(late[1], N + late[2], late[3], late[4], late[5], late[6]) end

-- A moved copy that takes no reservation at its home gives one back, handed over again.
local function give_back()
  if deadline_move then return end  -- moved with no slot reserved for it
  if home < 1 or home > N or not take_reservation(KEYS[home], now) then return end
  if grace then return end
  local l = limiters[home]
  local free = l.slots - redis.call('ZCOUNT', l.key, '(' .. now_text, '+inf')
  hand_over_parked(l.key, free, now, reserve, handed)
end

-- Refused (stale, or parked at i under id): a moved copy gives its reservation back, and
-- its home reference, if it names this copy and the run now parks elsewhere or ends, is
-- dropped (it no longer waits there).
local function refuse(status, i, id)
  local l, h = limiters[i], home >= 1 and home <= N and home ~= i and limiters[home]
  leave_home(h, run, park_id)
  give_back()
  if status == 4 then return reply(4, i, 0, 0, 0, 0) end
  -- its copy is published to its sub-line's queue (fair.lua)
  fair_parked(l.key, ARGV[11 + N + i], (l.ref and l.ref.since) or now_text, ARGV[13 + 2 * N])
  local used, until_first_end, hold = refusal_fields(l, now, grace)
  return reply(7, i, used, until_first_end, hold, id)
end

-- Given up at semaphore i (its max wait passed): its references dropped, nothing held.
local function give_up(i, since)
  for index, l in ipairs(limiters) do
    if l.ref and l.ref.state == 'w' then
      redis.call('HDEL', parked_key(l.key, 'pr'), run)
      count_down_waiting(l.key, l.counts)
    end
    drop_deadline(l.key, run, ARGV[11 + N + index])
  end
  give_back()
  return reply(5, i, since, 0, 0, 0)
end

-- Park the run at semaphore i: its reference (a new park id, its first 'since' kept).
local function park(i)
  local l, ref = limiters[i], limiters[i].ref
  local h = home >= 1 and home <= N and limiters[home]
  local since = ref and ref.since or (h and h.ref and h.ref.since ~= '' and h.ref.since)
  if past_deadline(since, max_wait, now) then return give_up(i, since) end
  parked_deadline(l.key, run, since or now_text, max_wait, ARGV[11 + N + i])
  local ahead = l.counts[1] + l.counts[2] - ((ref and ref.state == 'w') and 1 or 0)
  cost_parked(l.key, l.cost, math.max(0, ahead - live_reservations(l.key, now)))
  local id = park_reference(l, run, born, ref and ref.since or now_text, keep, KEYS[N + 1], now)
  keep_turn(rates, run)
  return refuse(7, i, id)
end

-- Phase 2: each semaphore decides (a moved copy's home first); the first that refuses
-- parks the run.
-- The home of a moved copy decides first: a copy that takes its reservation there had
-- its turn, and another semaphore only needs a slot that no body holds (free, else one
-- reserved for that semaphore's line, which it takes), whoever waits there: runs under
-- a global cap and a tenant's key are never held between lines that wait for each
-- other's reservations.
local order, turn = {}, false
if home >= 1 and home <= N and park_id ~= '' then order[1] = home end
for i = 1, N do
  if i ~= order[1] then order[#order + 1] = i end
end

-- Claimed by a live holder at semaphore i: this copy goes back to parking as it is.
local function back_to_parking(i)
  claimed_again(limiters[i], run)
  return refuse(7, i, limiters[i].ref.park_id)
end

-- Served, or claimed by a live holder, at any semaphore: this copy must not run (nor
-- park at another semaphore, where its reference would wait for nothing).
for i = 1, N do
  local ref = limiters[i].ref
  if i ~= home and ref and ref.state == 's' then return refuse(4, i) end
  if i ~= home and claimed_live(limiters[i], now) then return back_to_parking(i) end
end

for _, i in ipairs(order) do
  local l, ref = limiters[i], limiters[i].ref
  local decided = false
  if i == home and park_id ~= '' then
    local lost = string.match(park_id, '^([^:]*):') ~= born
    deadline_move = deadline_arrived(l.key, now)
    if lost then
      count_down_anonymous(l)
    elseif not ref or ref.park_id ~= park_id or ref.state == 's' then
      count_down_anonymous(l)
      return refuse(4, i)
    elseif claimed_live(l, now) then
      return back_to_parking(i)
    elseif past_deadline(ref.since, max_wait, now) then
      return give_up(i, ref.since)
    end
    if not (deadline_move or grace or l.paused) and reservation_fits(l, now) then
      l.take, decided, turn = 'reserved', true, true
    end
  end
  if not decided then
    if i == home and ref and ref.state == 's' then return refuse(4, i) end
    if i == home and claimed_live(l, now) then return back_to_parking(i) end
    local others = l.counts[1] + l.counts[2] - ((ref and ref.state == 'w') and 1 or 0)
    if turn and l.free < l.cost and not (grace or l.paused) and reservation_fits(l, now) then
      l.take = 'reserved'  -- a slot no body holds: the copy moved for it parks again
    elseif grace or l.paused or l.free < l.cost or (others > 0 and not turn) then
      return park(i)
    else
      l.take = 'free'
    end
  end
end

-- Phase 2b: the rates decide (parked_rates.lua); refused, the run parks at a rate and a
-- reference it waited with at its home semaphore is dropped.
local start, at = rates_start(rates, promised, now_us)
if at > 0 then
  if leave_home(home >= 1 and home <= N and limiters[home], run, park_id) then
    drop_deadline(KEYS[home], run, ARGV[11 + N + home])
  end
  give_back()
  local h = home >= 1 and home <= N and limiters[home].ref
  local id, wait = rates_park(rates, at, start, promised, run, keep, KEYS[#KEYS], now, now_us,
                              max_wait, h and h.since ~= '' and h.since or nil)
  return reply(7, N + at, 0, wait, -1, id)
end

-- Phase 3: admitted by every semaphore. One fencing number above every one's last.
local fence, contended, last = admission_marks(limiters, now_us)
local fence_text = string.format('%d', fence)
local lease_end = now + lease
local lease_end_text = string.format('%d', lease_end)
local member = token .. ' ' .. now_text .. ' ' .. fence_text .. ' ' .. description
for i = 1, N do
  hold_slot(limiters[i], run, token, member, fence_text, lease, lease_end, now,
            ARGV[11 + N + i], copy)
end
rates_admit(rates, run, keep, now, now_us, copy)
if #handed > 0 then return reply(1, 0, lease_end, fence_text, contended, last) end
return string.format('%s %s %s %d %d', now_text, lease_end_text, fence_text, contended, last)
