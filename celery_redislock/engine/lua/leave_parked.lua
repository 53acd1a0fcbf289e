-- A parked run leaves its line without running (revoked or expired, found when its copy
-- was moved out of parking; or it gave up): its reference is dropped if it waits under
-- this park id, and a copy that was moved out of parking gives back the reservation it
-- was moved for, which is handed over again. (store.lua, units.lua, parking.lua and
-- line.lua are put in front of this script.)
--
-- KEYS[1]   the semaphore, or a rate key (its line holds no reservation)
-- ARGV[1]   the run ('<task id>:<attempt>')
-- ARGV[2]   its park id ('' for whichever)
-- ARGV[3]   '1' if the copy was moved out of parking (it gives back a reservation)
-- ARGV[4]   how long a slot handed to the line stays reserved (ms)
--
-- Returns {left, move...}: 1 if the reference was dropped, and the moves owed.

local key, run, park_id = KEYS[1], ARGV[1], ARGV[2]
local now, now_us = server_now()
local out = {0}
local counts = parked_line(key)
if string.find(key, '}:r:', 1, true) then
  -- A rate's line (rate_parked.lua): the reference and its deadline are dropped; a copy
  -- a deadline move brought gives its line one start back (deadline.lua).
  local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
  if ref and ref.state == 'w' and (park_id == '' or ref.park_id == park_id) then
    redis.call('HDEL', parked_key(key, 'pr'), run)
    drop_deadline(key, run)
    if ARGV[3] == '1' and deadline_arrived(key, now, false) then
      local interval = tonumber(redis.call('HGET', parked_key(key, 'pn'), 'iv') or '') or 0
      rate_gave_up(key, ref, interval, now_us)
    end
    out[1] = 1
  end
  return out
end
if counts then
  local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
  if ref and ref.state == 'w' and (park_id == '' or ref.park_id == park_id) then
    redis.call('HDEL', parked_key(key, 'pr'), run)
    count_down_waiting(key, counts)
    redis.call('ZREM', parked_key(key, 'pd'), run)  -- its deadline (deadline.lua)
    out[1] = 1
  end
end
if ARGV[3] == '1' and take_reservation(key, now) then
  serve_line(key, now, tonumber(ARGV[4]), out)
end
return out
