-- Admit one run past N rate limiters at once, all or nothing, on the server's clock: the
-- admission of a run without semaphores (admit.lua without them), which may book a start
-- (ARGV[6+#KEYS]). (units.lua, line.lua, then admit_args.lua (the arguments and
-- replies) and admit_rates.lua are put in front of this script when it is loaded.)

-- Phase 1: read every rate limiter; stop at the first one that is paused.
local limiters, paused = read_all(read_rate_limiter)
if not limiters then return paused end

-- Phase 1b: does every rate limiter allow the run now? The first that does not refuses
-- it (a promise, or a booked start).
local rate_refusal = nil
for i = 1, #KEYS do
  local refusal = rate_check(i, limiters[i])
  if refusal and not rate_refusal then rate_refusal = refusal end
end
if rate_refusal then return rate_refused(rate_refusal) end

if probe then return reply(5, 0, 0, 0, 0, 0) end

-- Phase 2: admitted by every rate limiter: count the run's start in each.
local _, lease_end_text, fence_text = admitted_member(0)
for i = 1, #KEYS do take_start(limiters[i]) end
return admitted_reply(lease_end_text, fence_text, 0, 0)
