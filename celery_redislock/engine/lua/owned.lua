-- A lease owned by one task id: the unique lock of a task while it is queued or runs
-- (mark 'u'), and the once-per-period mark of a task (mark 'p'). One string key whose
-- value is the owning task id, with a PX expiry on the server's clock.
--
-- KEYS[1]   the key
-- ARGV[1]   'take' | 'once' | 'renew' | 'release'
-- ARGV[2]   the task id
-- ARGV[3]   lease (ms), for take, once and renew
--
-- take     taken (or taken again) by this id for the lease from now: nil; held by
--          another id: that id
-- once     as take, but a key this id holds already is left as it is (its period is
--          not extended): nil; held by another id: {that id, ms left}
-- renew    1 if this id held it and its lease now ends a lease from now, else 0
-- release  1 if this id held it and it is gone now, else 0 (compare-and-delete)

local key, op, id = KEYS[1], ARGV[1], ARGV[2]
local held = redis.call('GET', key)
if op == 'take' then
  if held and held ~= id then return held end
  redis.call('SET', key, id, 'PX', ARGV[3])
  return false
elseif op == 'once' then
  if held == id then return false end
  if held then return {held, redis.call('PTTL', key)} end
  redis.call('SET', key, id, 'PX', ARGV[3])
  return false
elseif op == 'renew' then
  if held ~= id then return 0 end
  redis.call('PEXPIRE', key, ARGV[3])
  return 1
elseif op == 'release' then
  if held ~= id then return 0 end
  redis.call('DEL', key)
  return 1
end
return redis.error_reply('unknown operation ' .. tostring(op))
