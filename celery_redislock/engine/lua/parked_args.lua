-- The arguments, replies and refusals of an admission on the parked line: what
-- admit_parked.lua reads, and the ways it refuses a run (stale, parked, given up). Put
-- in front of that script after parked_admit.lua and parked_rates.lua, whose functions
-- these use; see scripts.py. admit_parked.lua says what it decides, and its replies.
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
--              its slots over once the pause ends; then ' <ms>' if the caller confirms
--              its copy's publish within that many ms (parked_unsent.lua)
-- ARGV[11+N+i] the run's sub-line at semaphore i, for a fair line ('' or missing: none;
--              fair.lua): a copy parked there goes to that sub-line's parking queue
-- ARGV[12+2N]  the run's max wait (ms; '' or missing: none): a run parked that long is
--              given up (status 5; deadline.lua)
-- ARGV[13+2N]  how many ms of waiting are worth one step of priority (sub-lines with a
--              band; fair.lua)
-- ARGV[13+2N+i] the run's cost at semaphore i (missing: 1): it takes that many units,
--              and a reservation of its line is made in units of its head's cost
--              (parked_cost.lua)

local R = 0  -- rate keys (parked_rates.lua): '...}:r:...', after KEYS[N+1]
for _, key in ipairs(KEYS) do R = R + (string.find(key, '}:r:', 1, true) and 1 or 0) end
local N = #KEYS - 1 - (R > 0 and R + 1 or 0)
local token, lease, description, run = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local home = tonumber(ARGV[5]) or 0
local park_id, copy = string.match(ARGV[6], '^(%S*) ?(%S*)$')
local keep, reserve = tonumber(ARGV[7]), tonumber(ARGV[8])
local seen = tonumber(ARGV[9 + N] or '0') or 0
local bound = math.max(lease, tonumber(ARGV[10 + N] or '0') or 0)
local park_paused, unsent_ms = string.match(ARGV[11 + N] or '0', '^(%S*) ?(%S*)$')
park_paused, unsent_ms = park_paused == '1', tonumber(unsent_ms)
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

-- Every semaphore as read (parked_admit.lua) and the rates (parked_rates.lua), filled
-- in by admit_parked.lua's first phase.
local limiters = {}
local rates

-- A moved copy that takes no reservation at its home gives one back, handed over again.
local function give_back()
  if deadline_move then return end  -- moved with no slot reserved for it
  if home < 1 or home > N or not take_reservation(KEYS[home], now, copy) then return end
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
  if unsent_ms then await_copy(l.key, run, id, now + unsent_ms) end  -- parked_unsent.lua
  keep_turn(rates, run)
  return refuse(7, i, id)
end

-- Claimed by a live holder at semaphore i: this copy goes back to parking as it is.
local function back_to_parking(i)
  claimed_again(limiters[i], run)
  return refuse(7, i, limiters[i].ref.park_id)
end
