-- Move the oldest parked message to the front of its target list, once per job.
-- KEYS[1] the parking list, KEYS[2] the job's done marker, KEYS[3] the unroutable list.
-- ARGV[1] the broker's global key prefix, ARGV[2] kombu's priority separator,
-- ARGV[3] the marker's life (s).
-- A parking list is pushed on the left, so its oldest message is on the right; kombu's
-- Redis transport takes a queue's next message with BRPOP (the right end): the message
-- is pushed on the right of its target, to be taken next. Its target was written when
-- it was parked as the payload's first field, "redislock_to": "<priority step> <queue>",
-- read here without decoding the message (its cost does not grow with the body), or
-- by decoding it when the queue's name has characters JSON escapes. The list is the
-- queue's list for that step, as kombu's _put names it. Returns "moved <list>", "empty"
-- or "unroutable", prefixed with "again " when this job was done before.
local before = redis.call('GET', KEYS[2])
if before then
  return 'again ' .. before
end
local result = 'empty'
local raw = redis.call('RPOP', KEYS[1])
if raw then
  local step, queue = string.match(raw, '^{"redislock_to": ?"(%d) ([^"\\]+)"')
  if not step then
    local ok, message = pcall(cjson.decode, raw)
    local to = ok and type(message) == 'table' and message.redislock_to
    if type(to) == 'string' then
      step, queue = string.match(to, '^(%d) (.+)$')
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
  else
    redis.call('LPUSH', KEYS[3], raw)
    result = 'unroutable'
  end
end
redis.call('SET', KEYS[2], result, 'EX', ARGV[3])
return result
