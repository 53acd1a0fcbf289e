-- A message left a fair line's sub-line with no move owed from it: the mover took a
-- move owed from the line's own queue (its count of anonymous entries, or references
-- no sub-line counts) from a sub-line it saw holding messages (line/moves.py). That
-- sub-line counts one copy less, if it counted any (fair.lua's fair_took): else it would
-- stay counted as waiting with nothing parked, and its next move would find nothing.
-- (fair.lua and parking.lua are put in front of this script.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the sub-line the message left
--
-- Returns 1 if the sub-line counted one copy less, else 0.

return fair_took(KEYS[1], ARGV[1] or '')
