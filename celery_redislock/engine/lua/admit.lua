-- Admit one run past N limiters at once, semaphores and rate limiters together, all or
-- nothing, on the server's clock. (store.lua, units.lua, fair.lua, parked_cost.lua,
-- parking.lua, deadline.lua, line.lua, then admit_args.lua (the arguments and replies),
-- admit_semaphore.lua and admit_rates.lua are put in front of this script when it is
-- loaded.) A run of semaphores only asks admit_slots.lua, a run of rate limiters only
-- admit_rate.lua: the same, without the other kind's code.

-- Phase 1: look at every limiter; stop at the first one that refuses the run.
local limiters, refusal = read_all(function(i, key, spec)
  if string.sub(spec, 1, 1) == 's' then return read_semaphore(i, key, spec) end
  return read_rate_limiter(i, key, spec)
end)
if not limiters then return refusal end

-- Phase 1b: every semaphore has a slot for the run; now the rate limiters.
local rate_refusal = nil
for i = 1, #KEYS do
  local limiter = limiters[i]
  if limiter.kind == 'r' then
    local refusal = rate_check(i, limiter)
    if refusal and not rate_refusal then rate_refusal = refusal end
  end
end
if rate_refusal then return rate_refused(rate_refusal) end

if probe then return reply(5, 0, 0, 0, 0, 0) end

-- Phase 2: admitted by every limiter: take every slot, count every start.
local fence, contended, last = fence_of(limiters)
local lease_end, lease_end_text, fence_text, member = admitted_member(fence)
for i = 1, #KEYS do
  local limiter = limiters[i]
  if limiter.kind == 's' then
    take_slots(limiter, member, lease_end, lease_end_text, fence_text)
  else
    take_start(limiter)
  end
end
return admitted_reply(lease_end_text, fence_text, contended, last)
