-- A standby handed the slot of a run that ended in its worker, without waiting: the
-- worker sent the standby to its pool under that run's lease (its holder stays, as a
-- slot handed on does: the store sees one holder throughout), and this script, sent
-- without waiting for its answer, moves the standby's reference to that holder: the
-- holder's own claim served (its run ended), its lease renewed from now (the standby
-- runs under it: a chain of standbys passes one lease on, which stays young), the
-- standby's reference claimed by the holder until that new end (served when the
-- standby's body starts, or at the holder's release), and the next standby owed.
-- (standby_owe.lua, with what it needs, is put in front of this script; see
-- engine/standby.py.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the holder's member
-- ARGV[2]   the standby's run ('<task id>:<attempt>'), ARGV[3] its park id
-- ARGV[4]   the lease (ms), renewed from now on the server's clock; missing: not renewed
--
-- Returns {1 if the reference was claimed by the holder (else 0: the holder's lease is
-- gone, or the reference is not the standby's), moves owed...}.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key, member, run, park_id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local lease = tonumber(ARGV[4] or '')

-- The holder's lease renewed for `lease` ms from now (the key kept at least as long, as
-- renew.lua does); its new end.
local function renew(lease_end)
  redis.call('ZADD', key, 'XX', string.format('%d', lease_end), member)
  if redis.call('PTTL', key) < lease then
    redis.call('ZADD', key, string.format('%d', 1000 - lease_end), '#ttl')
    redis.call('PEXPIRE', key, lease)
  end
  return lease_end
end

local out, claimed = {}, 0
local score = redis.call('ZSCORE', key, member)
if score and tonumber(score) > now then
  local holder = token_of(member)
  serve_claim(key, holder, now)
  local lease_end = lease and renew(now + lease) or tonumber(score)
  local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
  if ref and ref.state == 'c' and ref.park_id == park_id then
    claim_until(key, ref.holder, nil)
    write_ref(key, run, 'c', ref.since, ref.park_id, holder, '', ref.copy)
    redis.call('HSET', parked_key(key, 'pc'), holder, run)
    keep_parked(parked_key(key, 'pc'))
    claim_until(key, holder, lease_end)
    claimed = 1
  end
end
standby_owe(key, now, out)
return {claimed, unpack(out)}
