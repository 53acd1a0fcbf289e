-- The arguments and replies of an admission: one run past N limiters at once, all or
-- nothing, on the server's clock. Shared by the admission scripts by mode (put in front
-- of them after line.lua, see scripts.py): admit_slots.lua (semaphores only, over
-- admit_semaphore.lua), admit_rate.lua (rate limiters only, over admit_rates.lua) and
-- admit.lua (both kinds at once). A run on the parked line asks admit_parked.lua.
--
-- KEYS[i]     the key of limiter i: a semaphore (admit_semaphore.lua) or a rate limiter
--             (admit_rates.lua)
-- ARGV[1]     holder token, unique per acquisition
-- ARGV[2]     lease length (ms)
-- ARGV[3]     holder description (opaque text for operators)
-- ARGV[3+i]   limiter i: 's:<slots>' or 'r:<interval us>:<tolerance us>:<promise>'
--             (either followed by ':<cost>' for a run that takes <cost> slots, or uses
--             <cost> starts, at once), the
--             promise being the start time (us) promised earlier, 0 for none, or -1 for
--             a caller that will not wait (refused, it is told when to try, promised
--             nothing)
-- ARGV[4+#KEYS]  the latest incarnation of the store the caller saw (its 'born', or a
--             fencing number it was given; 0 if none; -1 on Redis Cluster; see
--             store.lua): a semaphore refuses (status 0) during the grace that follows
--             a loss of the store's data
-- ARGV[5+#KEYS]  '1' for a probe: refused, the run is refused as always (and what a
--             refusal writes is written: a rate limiter's promise); admitted by every
--             limiter, nothing is taken and the reply is {5, now, 0, 0, 0, 0, 0} (a
--             worker's main process asks so when no pool process is free)
-- ARGV[6+#KEYS]  how far ahead (ms) the caller takes a booked start, or '0': a run whose
--             one limiter is a rate limiter that would be promised a
--             start within that time (a newcomer, or a run that came back late), or
--             that came back early for a start within that time that is the first the
--             GCRA allows (no start promised before it is due), is admitted from that
--             start instead: the start is counted as taken then,
--             and the caller holds the run until then and starts it without asking
--             again (a worker's main process; it gives the start back with refund.lua
--             if it cannot start the run on time)
-- ARGV[7+#KEYS]  the longest lease (ms) the caller's process knows of, if longer than
--             its own: the grace after a loss lasts at least that long (store.lua)
--
-- Replies:
--   "now_ms lease_end_ms fence contended last"   admitted. The holder's entry in every
--                                           semaphore is "token now_ms fence description"
--                                           (fence 0 without one); contended is 1 if a
--                                           semaphore keeps an average hold time (it
--                                           refused a run, or has a parked line); last
--                                           is 1 if the run took the last free slot of
--                                           a semaphore (whoever asks next waits for it)
--   {status, now_ms, i, a, b, c, d}:
--     {0, now, i, holders, ms_until_first_lease_end, average_hold_ms, 0}
--                                semaphore i is full
--     {2, now, i, promise_us, wait_ms, 0, ahead}   rate limiter i refused; the run is
--                                promised a start time (ahead: how many starts come
--                                before it); nothing else is written
--     {3, now, i, pause_end_ms or -1, 0, 0, 0}   limiter i is paused by an operator
--     {5, now, 0, 0, 0, 0, 0}    a probe: every limiter would admit the run
--     {6, now, i, start_us, wait_ms, tat, ahead}   admitted from the booked start start_us
--                                (ARGV[6+#KEYS]): the run is not to start before it;
--                                tat is what the booking wrote (see refund.lua)

local token = ARGV[1]
local lease = tonumber(ARGV[2])
local description = ARGV[3]
local STATISTICS_TTL = 60000
local seen = tonumber(ARGV[4 + #KEYS] or '0') or 0
local probe = ARGV[5 + #KEYS] == '1'
local book_ms = tonumber(ARGV[6 + #KEYS] or '0') or 0
local bound = math.max(lease, tonumber(ARGV[7 + #KEYS] or '0') or 0)
local now, now_us = server_now()
-- Numbers go to Redis and into the reply as text made here with '%d': Lua's own number
-- to text conversion (and '%.0f') takes the C library's slow floating-point path.
local now_text = string.format('%d', now)

-- Phase 1 of an admission: every limiter read by `reader(i, KEYS[i], ARGV[3+i])`
-- (read_semaphore, read_rate_limiter, or one that picks by the spec's kind), which
-- answers the limiter, or nil and the run's refusal. The limiters in order, or nil and
-- the first refusal (the limiters after it are not read).
local function read_all(reader)
  local limiters = {}
  for i = 1, #KEYS do
    local limiter, refusal = reader(i, KEYS[i], ARGV[3 + i])
    if not limiter then return nil, refusal end
    limiters[i] = limiter
  end
  return limiters
end

local function number(value)
  return tonumber(value or '0') or 0
end

local function reply(status, i, a, b, c, d)
  return {status, now, i, a, b, c, d}
end

-- The admission's one lease, admitted by every limiter: its end, and the text of its
-- holder's entry "token now_ms fence description" in every semaphore.
local function admitted_member(fence)
  local fence_text = string.format('%d', fence)
  local lease_end = now + lease
  return lease_end, string.format('%d', lease_end), fence_text,
         token .. ' ' .. now_text .. ' ' .. fence_text .. ' ' .. description
end

-- The reply of an admission.
local function admitted_reply(lease_end_text, fence_text, contended, last)
  return string.format('%s %s %s %d %d', now_text, lease_end_text, fence_text, contended,
                       last)
end
