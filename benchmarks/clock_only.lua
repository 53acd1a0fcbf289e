-- The admission script's stand-in for the task-overhead benchmark's script-call floor:
-- it takes the admission's keys and arguments, ignores them, and answers like an
-- uncontended admission ("now_ms lease_end_ms fence 0 0"), with the server's clock in
-- place of each number (the fence as the clock in microseconds, as an uncontended
-- admission's usually is).
local clock = redis.call('TIME')
local ms = clock[1] .. string.format('%03d', math.floor(clock[2] / 1000))
return ms .. ' ' .. ms .. ' ' .. clock[1] .. string.format('%06d', clock[2]) .. ' 0 0'
