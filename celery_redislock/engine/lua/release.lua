-- Give back the slots of one holder in N leased semaphores (see admit.lua), and hand
-- them to their parked lines (store.lua, units.lua, fair.lua, parked_cost.lua,
-- parking.lua, deadline.lua and line.lua are put in front of this script).
--
-- KEYS[i]   semaphore i
-- ARGV[1]   the holder's member, "token acquired_ms fence description"
-- ARGV[2]   how long it held the slots (ms), for the average hold time
-- ARGV[3]   how long a slot handed to a parked line stays reserved for it (ms); 0 for
--           a caller that cannot move a parked message (the slot is then simply free)
-- ARGV[3+i] the holder's cost in semaphore i (units.lua), if above 1; missing: 1
--
-- Returns {released, move...}: in how many of the N semaphores the holder was removed
-- (0 when it held none: released already, or its lease ran out, so releasing twice is
-- harmless and a holder never frees a slot another holder has), and the moves owed out
-- of the parking queues of the lines handed a slot ('!move <count> <key>', see
-- parking.lua). The reference of a parked run this holder claimed becomes served. The
-- average hold time is kept only for semaphores that have refused a run (a refusal
-- reports it).

local member = ARGV[1]
local held = tonumber(ARGV[2])
local reserve = tonumber(ARGV[3] or '0')
local released = 0
local handed = {}
local now = nil

for i = 1, #KEYS do
  local key = KEYS[i]
  now = now or server_now()
  serve_claim(key, token_of(member), now)  -- a parked run's reference: served (parking.lua)
  if redis.call('ZREM', key, member) == 1 then
    remove_units(key, token_of(member), cost_of(3, i))
    released = released + 1
    local average = redis.call('ZSCORE', key, '#hold')
    if average then
      average = -tonumber(average) - 1
      local kept = held
      if average >= 0 then kept = average * 0.8 + held * 0.2 end
      redis.call('ZADD', key, -1 - math.floor(kept), '#hold')
    end
    serve_line(key, now, reserve, handed)
  end
end
local answer = {released}
for _, message in ipairs(handed) do answer[#answer + 1] = message end
return answer
