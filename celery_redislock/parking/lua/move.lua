-- Move the oldest parked message to the front of its target list, once per job, and
-- keep a backup of it until a worker that received it claims it (claimed.lua), or
-- restore.lua puts it back in its parking list.
-- KEYS[1] the parking list, KEYS[2] the job's done marker, KEYS[3] the unroutable list,
-- KEYS[4] the index of backups (sorted set: move id -> when it is restored, ms),
-- KEYS[5] the registry hash (parking queue -> semaphore key).
-- ARGV[1] the broker's global key prefix, ARGV[2] kombu's priority separator,
-- ARGV[3] the marker's life (s), ARGV[4] the backups' key prefix (prefixed),
-- ARGV[5] when (ms after the move) restore.lua first looks at an unclaimed backup,
-- ARGV[6] a backup's life (s), ARGV[7] the parking queue's name (unprefixed).
-- A parking list is pushed on the left, so its oldest message is on the right; kombu's
-- Redis transport takes a queue's next message with BRPOP (the right end): the message
-- is pushed on the right of its target, to be taken next. Its target was written when
-- it was parked as the payload's first field, "redislock_to": "<priority step> <queue>",
-- and its move id as the second, "redislock_move", read here without decoding the
-- message (its cost does not grow with the body), or by decoding it when the queue's
-- name has characters JSON escapes. The list is the queue's list for that step, as
-- kombu's _put names it. A message parked without a move id (by an older version) is
-- moved without a backup. Returns "moved <list>", "empty" or "unroutable", prefixed
-- with "again " when this job was done before.
local before = redis.call('GET', KEYS[2])
if before then
  return 'again ' .. before
end
local result = 'empty'
local raw = redis.call('RPOP', KEYS[1])
if raw then
  local step, queue, move = string.match(
    raw, '^{"redislock_to": ?"(%d) ([^"\\]+)", ?"redislock_move": ?"(%w+)"')
  if not step then
    step, queue = string.match(raw, '^{"redislock_to": ?"(%d) ([^"\\]+)"')
  end
  if not step then
    local ok, message = pcall(cjson.decode, raw)
    local to = ok and type(message) == 'table' and message.redislock_to
    if type(to) == 'string' then
      step, queue = string.match(to, '^(%d) (.+)$')
      local id = message.redislock_move
      move = type(id) == 'string' and string.match(id, '^%w+$') or nil
    end
  end
  local target = nil
  if step then
    target = ARGV[1] .. queue
    if step ~= '0' then
      target = target .. ARGV[2] .. step
    end
  end
  local kind = target and redis.call('TYPE', target).ok
  if kind == 'list' or kind == 'none' then
    redis.call('RPUSH', target, raw)
    result = 'moved ' .. target
    if move then
      local clock = redis.call('TIME')
      local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
      local backup = ARGV[4] .. move
      redis.call('HSET', backup, 'q', KEYS[1], 'm', raw, 'n', ARGV[7], 't', target,
                 'k', redis.call('HGET', KEYS[5], ARGV[7]) or '', 'a', now)
      redis.call('EXPIRE', backup, ARGV[6])
      redis.call('ZADD', KEYS[4], now + tonumber(ARGV[5]), move)
    end
  else
    redis.call('LPUSH', KEYS[3], raw)
    result = 'unroutable'
  end
end
redis.call('SET', KEYS[2], result, 'EX', ARGV[3])
return result
