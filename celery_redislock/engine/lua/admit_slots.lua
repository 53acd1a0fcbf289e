-- Admit one run past N semaphores at once, all or nothing, on the server's clock: the
-- admission of a run without rate limits (admit.lua without them). (store.lua, units.lua,
-- fair.lua, parked_cost.lua, parking.lua, deadline.lua, line.lua, then admit_args.lua
-- (the arguments and replies) and admit_semaphore.lua are put in front of this script
-- when it is loaded.)

-- Phase 1: look at every semaphore; stop at the first one that refuses the run.
local limiters, refusal = read_all(read_semaphore)
if not limiters then return refusal end

if probe then return reply(5, 0, 0, 0, 0, 0) end

-- Phase 2: every semaphore has a slot for the run: take them.
local fence, contended, last = fence_of(limiters)
local lease_end, lease_end_text, fence_text, member = admitted_member(fence)
for i = 1, #KEYS do
  take_slots(limiters[i], member, lease_end, lease_end_text, fence_text)
end
return admitted_reply(lease_end_text, fence_text, contended, last)
