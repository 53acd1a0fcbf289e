-- A worker received a moved copy: its backup (move.lua) is no longer needed.
-- KEYS[1] the index of backups, KEYS[2] the copy's backup.
-- ARGV[1] the copy's move id.
-- Returns 1 if the backup was there (this copy is the one kept), 0 if it was gone
-- (restored already, or never written): one atomic step against restore.lua, so that a
-- backup is either claimed or restored, never both.
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('DEL', KEYS[2])
