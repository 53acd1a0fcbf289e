-- The copy of a run parked by the process that runs it is in its parking queue
-- (pool/pool_park.py): its reference no longer waits for the confirmation, and
-- one that lapsed meanwhile is counted as waiting again (parked_unsent.lua, which is put
-- in front of this script after parking.lua).
--
-- KEYS[1]  the semaphore the run parked at
-- ARGV[1]  the run ('<task id>:<attempt>')        ARGV[2]  its park id
--
-- Returns 1 if its reference was awaiting the confirmation, else 0.

return copy_sent(KEYS[1], ARGV[1], ARGV[2], nil)
