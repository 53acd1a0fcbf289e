-- Look at the moved messages' backups due (move.lua; claimed.lua drops a backup once a
-- worker received its copy). A copy still in the queue it was moved to is late, not
-- lost: looked for again ARGV[4] ms later, and named in the reply if a live worker
-- consumes that queue, so that the poll keeps its reservation as long as it is seen
-- there. It is looked for among the last ARGV[3] entries at the queue's right end,
-- where it was pushed and only pops take from; in a queue longer than that it is not
-- looked for (the scan would grow with the queue) and counts as still there, named
-- apart (presumed, not seen: the lock store keeps it for a bounded time only): a lost
-- one is put back once the queue is shorter. A queue is consumed while some worker's
-- poll, which names the queues its worker consumes here (ARGV[8..]), did so within
-- ARGV[6] ms (KEYS[4]): a copy in a queue no running worker consumes is not named, and
-- its reservation lapses as any. A copy whose delivery tag is in
-- kombu's unacked hash (KEYS[3]) was received and is kept by kombu until acknowledged
-- (its claim is late): its backup is dropped. A copy neither queued nor received is
-- lost (a worker popped it and died before kombu kept it) once ARGV[5] ms passed since
-- its move or since it was last seen in its queue (a late copy's claim is as late as a
-- fresh one's: looked at again then, if sooner): its message is put back at the right
-- end of its parking list, the next to move, so it keeps its place.
-- KEYS[1] the index of backups (sorted set: move id -> when it is looked at, ms),
-- KEYS[2] the registry hash (parking queue -> semaphore key), KEYS[3] kombu's unacked
-- hash, KEYS[4] the consumed queues (sorted set: list -> until when, ms).
-- ARGV[1] the backups' key prefix (prefixed), ARGV[2] how many at most,
-- ARGV[3] how far from its queue's right end a copy is looked for,
-- ARGV[4] when a copy still in its queue is looked for again (ms),
-- ARGV[5] how long (ms) after its move a copy not received is lost,
-- ARGV[6] how long (ms) a queue counts as consumed after a poll named it,
-- ARGV[7] kombu's priority separator, ARGV[8..] the caller's consumed queues' lists.
-- Each backup is taken whole in this one script (claimed.lua takes it otherwise): a
-- copy received later finds it gone, and the lock store's reference decides which copy
-- runs. The message put back is given a copy id of its own (its move id, written where
-- the park wrote it: the "redislock_move" field and the wait header's "move", with an
-- 'r' added): the lock store lets a copy run again only under the id of the copy that
-- ran (one the broker gave back), so a copy put back after the moved one ran ends
-- unrun. (A move id is 16 random hex digits, or such an id with 'r's: found nowhere
-- else in the message.) A parking list that is another type now is left alone (the
-- backup is dropped).
-- Returns {{new move id, parking list, ... of those put back}, {move id, line, ... of
-- the copies seen in their queue}, how many backups were due, {move id, line, ... of
-- the copies presumed in their queue (too long to look in)}}.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out, late, presumed = {}, {}, {}
local depth = tonumber(ARGV[3])
local sep = ARGV[7]

for i = 8, #ARGV do redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[6]))

-- Whether the copy backed up in `backup` is still in `target`, the queue it was moved
-- to: 'seen' among its last `depth` entries, 'presumed' in a longer queue, else false.
local function still_queued(target, backup)
  if not (target and redis.call('TYPE', target).ok == 'list') then return false end
  if redis.call('LLEN', target) > depth then return 'presumed' end
  local message = redis.call('HGET', backup, 'm')
  local found = message and redis.call('LPOS', target, message, 'RANK', -1, 'MAXLEN', depth)
  return found and 'seen' or false
end

-- Whether some running worker consumes `target` (a queue's list, or its priority
-- step's: '<queue><sep><digit>').
local function consumed(target)
  local base = target
  if #target > #sep + 1 and string.sub(target, -#sep - 1, -2) == sep then
    base = string.sub(target, 1, -#sep - 2)
  end
  local until_ms = redis.call('ZSCORE', KEYS[4], base)
  return until_ms ~= false and tonumber(until_ms) > now
end

-- Whether kombu received the copy `message` and keeps it until acknowledged.
local function received(message)
  local tag = nil  -- the copy's delivery tag: the payload's last, in its properties
  for found_tag in string.gmatch(message or '', '"delivery_tag": ?"([^"\\]+)"') do
    tag = found_tag
  end
  return tag and redis.call('HEXISTS', KEYS[3], tag) == 1
end

-- Put `message` (moved as `move`) back at the right end of parking list `parking`
-- (queue `queue` of line `line`), under a copy id of its own.
local function put_back(move, message, parking, queue, line)
  local kind = redis.call('TYPE', parking).ok
  if kind ~= 'list' and kind ~= 'none' then return end
  local again = move .. 'r'
  redis.call('RPUSH', parking, (string.gsub(message, move, again)))
  if queue and line and line ~= '' then redis.call('HSET', KEYS[2], queue, line) end
  out[#out + 1] = again
  out[#out + 1] = parking
end

for _, move in ipairs(due) do
  redis.call('ZREM', KEYS[1], move)
  local backup = ARGV[1] .. move
  local found = redis.call('HMGET', backup, 'q', 'n', 'k', 't', 'a')
  local parking, queue, line, target = found[1], found[2], found[3], found[4]
  local lost_at = tonumber(found[5] or '') and tonumber(found[5]) + tonumber(ARGV[5])
  local queued = still_queued(target, backup)
  if queued then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), move)
    redis.call('HSET', backup, 'a', now)  -- seen: lost only ARGV[5] ms after this
    if line and line ~= '' and consumed(target) then
      local named = queued == 'seen' and late or presumed
      named[#named + 1] = move
      named[#named + 1] = line
    end
  else
    local message = redis.call('HGET', backup, 'm')
    if received(message) then  -- kombu keeps it until acknowledged: not lost
      redis.call('DEL', backup)
    elseif lost_at and lost_at > now then  -- not lost yet: looked at again then
      redis.call('ZADD', KEYS[1], lost_at, move)
    else
      redis.call('DEL', backup)
      if parking and message then put_back(move, message, parking, queue, line) end
    end
  end
end
return {out, late, #due, presumed}
