-- A standby handed the slot of a run that ended in its worker, without waiting: the
-- worker sent the standby to its pool under that run's lease (its holder stays, as a
-- slot handed on does: the store sees one holder throughout), and this script, sent
-- without waiting for its answer, moves the standby's reference to that holder: the
-- holder's own claim served (its run ended), the standby's reference claimed by the
-- holder until its lease ends (served when the standby's body starts, or at the
-- holder's release), and the next standby owed. (standby_owe.lua, with what it needs,
-- is put in front of this script; see engine/standby.py.)
--
-- KEYS[1]   the semaphore
-- ARGV[1]   the holder's member
-- ARGV[2]   the standby's run ('<task id>:<attempt>'), ARGV[3] its park id
--
-- Returns {1 if the reference was claimed by the holder (else 0: the holder's lease is
-- gone, or the reference is not the standby's), moves owed...}.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key, member, run, park_id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local out, claimed = {}, 0
local score = redis.call('ZSCORE', key, member)
if score and tonumber(score) > now then
  local holder = token_of(member)
  serve_claim(key, holder, now)
  local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
  if ref and ref.state == 'c' and ref.park_id == park_id then
    claim_until(key, ref.holder, nil)
    write_ref(key, run, 'c', ref.since, ref.park_id, holder, '', ref.copy)
    redis.call('HSET', parked_key(key, 'pc'), holder, run)
    keep_parked(parked_key(key, 'pc'))
    claim_until(key, holder, tonumber(score))
    claimed = 1
  end
end
standby_owe(key, now, out)
return {claimed, unpack(out)}
