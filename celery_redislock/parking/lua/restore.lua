-- Put back in their parking lists the moved messages no worker claimed in time and
-- that are no longer in the queue they were moved to (a worker popped the copy and died
-- before kombu kept it): each at the right end, the next to move, so it keeps its place.
-- A copy still in its queue (among the last ARGV[3] entries at its right end, where it
-- was pushed and only pops take from) is late, not lost: it is looked for again
-- ARGV[4] ms later. A copy whose delivery tag is in kombu's unacked hash (KEYS[3]) was
-- received and is kept by kombu until acknowledged (its claim is late): not put back.
-- KEYS[1] the index of backups (sorted set: move id -> when it is restored, ms),
-- KEYS[2] the registry hash (parking queue -> semaphore key).
-- ARGV[1] the backups' key prefix (prefixed), ARGV[2] how many at most,
-- ARGV[3] how far from its queue's right end a copy is looked for,
-- ARGV[4] when a copy still in its queue is looked for again (ms).
-- Each backup is taken whole in this one script (claimed.lua takes it otherwise): a
-- copy received later finds it gone, and the lock store's reference decides which copy
-- runs. The message put back is given a copy id of its own (its move id, written where
-- the park wrote it: the "redislock_move" field and the wait header's "move", with an
-- 'r' added): the lock store lets a copy run again only under the id of the copy that
-- ran (one the broker gave back), so a copy put back after the moved one ran ends
-- unrun. (A move id is 16 random hex digits, or such an id with 'r's: found nowhere
-- else in the message.) A parking list that is another type now is left alone (the
-- backup is dropped).
-- Returns new move id, parking list, ... of those put back.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, move in ipairs(due) do
  redis.call('ZREM', KEYS[1], move)
  local backup = ARGV[1] .. move
  local found = redis.call('HMGET', backup, 'q', 'm', 'n', 'k', 't')
  local queued = found[2] and found[5] and redis.call('TYPE', found[5]).ok == 'list'
    and redis.call('LPOS', found[5], found[2], 'RANK', -1, 'MAXLEN', tonumber(ARGV[3]))
  local tag = nil  -- the copy's delivery tag: the payload's last, in its properties
  for found_tag in string.gmatch(found[2] or '', '"delivery_tag": ?"([^"\\]+)"') do
    tag = found_tag
  end
  if not queued and tag and redis.call('HEXISTS', KEYS[3], tag) == 1 then
    found[1] = nil  -- received, and kombu keeps it until acknowledged: not lost
  end
  if queued then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), move)
  else
    redis.call('DEL', backup)
  end
  if found[1] and found[2] and not queued then
    local kind = redis.call('TYPE', found[1]).ok
    if kind == 'list' or kind == 'none' then
      local again = move .. 'r'
      redis.call('RPUSH', found[1], (string.gsub(found[2], move, again)))
      if found[3] and found[4] and found[4] ~= '' then
        redis.call('HSET', KEYS[2], found[3], found[4])
      end
      out[#out + 1] = again
      out[#out + 1] = found[1]
    end
  end
end
return out
