-- The claims of a parked line's references ('}:pc:' and '}:pe:', described in
-- parking.lua): a claim held until its holder's lease ends, lapsed when the lease runs
-- out unreleased, served when the run's body starts (default acks) or ends (acks late).
-- (Put in front of the scripts right after parking.lua, whose functions it uses; see
-- scripts.py.)

-- The claim of holder `token` at `key` (a live one) until its lease ends (`lease_end`,
-- ms), or dropped (`lease_end` nil: served, or the run's reference rewritten).
local function claim_until(key, token, lease_end)
  local ends = claim_ends(key)
  if not lease_end then
    redis.call('HDEL', parked_key(key, 'pc'), token)
    redis.call('ZREM', ends, token)
    return
  end
  redis.call('ZADD', ends, string.format('%d', lease_end), token)
  keep_parked(ends)
end

-- Claims whose holder's lease ran out unreleased (its release never came: the store
-- did not answer it, or its worker died) lapse, a few at each call of the line's
-- scripts, in the order their leases ended (the server's clock): the claim is dropped,
-- and its reference stays claimed by the dead holder (a copy the broker gives back
-- claims in its place) for as long as the broker may give one back ('k' ms), then is
-- forgotten if nothing rewrote it. A reference whose run has a copy parked again (its
-- 'again' mark) is kept: that copy still comes, and claims in its place.
local function lapse_claims(key, now)
  local ends = claim_ends(key)
  local lapsed = redis.call('ZRANGEBYSCORE', ends, '-inf', now, 'LIMIT', 0, LAPSE_CLAIMS)
  if #lapsed == 0 then return end
  redis.call('ZREM', ends, unpack(lapsed))
  local claims, refs = parked_key(key, 'pc'), parked_key(key, 'pr')
  for _, entry in ipairs(lapsed) do
    local at = string.find(entry, ' ', 1, true)
    local token = at and string.sub(entry, 1, at - 1) or entry
    local run = at and string.sub(entry, at + 1) or redis.call('HGET', claims, token)
    local ref = run and parse_ref(redis.call('HGET', refs, run))
    local dead = ref and ref.state == 'c' and ref.holder == token and ref.again == ''
    if at and dead then
      redis.call('HDEL', refs, run)
    elseif run and not at then
      redis.call('HDEL', claims, token)
      if dead then
        local keep = tonumber(redis.call('HGET', parked_key(key, 'pn'), 'k') or '') or 3600000
        redis.call('ZADD', ends, string.format('%d', now + keep), token .. ' ' .. run)
        keep_parked(ends)
      end
    end
  end
end

-- The reference claimed by holder `token` (if any) becomes served: its body started
-- under default acks, or ended (with the claiming copy's id, acks late). Returns 1 if
-- one did.
local function serve_claim(key, token, now)
  local claims = parked_key(key, 'pc')
  local run = redis.call('HGET', claims, token)
  if not run then return 0 end
  claim_until(key, token, nil)
  local ref = parse_ref(redis.call('HGET', parked_key(key, 'pr'), run))
  if not (ref and ref.state == 'c' and ref.holder == token) then return 0 end
  local keep = tonumber(redis.call('HGET', parked_key(key, 'pn'), 'k') or '') or 3600000
  write_ref(key, run, 's', ref.since, ref.park_id, token, '', ref.copy)
  local served = parked_key(key, 'px')
  redis.call('RPUSH', served, string.format('%d', now + keep) .. ' ' .. run)
  keep_parked(served)
  return 1
end
