-- Admit one run past N semaphores on the parked line (parking.lua), all or nothing, on
-- the server's clock; a refusal writes the run's reference in the same call (it parks).
-- (store.lua, units.lua, fair.lua, parked_cost.lua, parking.lua, deadline.lua, line.lua
-- parked_admit.lua, parked_rates.lua and parked_args.lua, which reads its keys and
-- arguments and holds its refusals, are put in front of this script.)
-- Semaphores of any cost (units.lua, parked_cost.lua), and rate limits of any cost
-- (parked_rates.lua: their keys and arguments follow); the holders are admit.lua's
-- ("token acquired_ms fence description" scored by the end of the lease), so renew,
-- adopt and release work as ever.
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

-- Phase 1: read every semaphore.
for i = 1, N do
  local l = read_semaphore(KEYS[i], ARGV[8 + i], cost_of(13 + 2 * N, i), run, now)
  if l.paused and not park_paused then return reply(3, i, l.paused, 0, 0, 0) end
  rerun_ref(l, copy, park_id)
  limiters[i] = l
end
rates = read_rates(N + 2, R, 14 + 3 * N, run, now, now_us, copy)
local home_rate = home > N + 1 and home - N - 1 or 0
local promised = rate_turn(rates, home_rate, park_id)  -- a turn at the rates
if promised == 'stale' then return reply(4, N + math.max(home_rate, 1), 0, 0, 0, 0) end
local late = promised and rate_late(rates, home_rate, run, max_wait, keep, now, now_us)
if late then return reply(late[1], N + late[2], late[3], late[4], late[5], late[6]) end

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
    deadline_move = deadline_arrived(l.key, now, deadline_member(run, ARGV[11 + N + i]))
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
