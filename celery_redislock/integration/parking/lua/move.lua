-- Move the oldest parked message to the front of its target list, once per job.
-- KEYS[1] the parking list, KEYS[2] the job's done marker, KEYS[3] the unroutable list.
-- ARGV[1] the route header's name, ARGV[2] the broker's global key prefix,
-- ARGV[3] the marker's life (s).
-- A parking list is pushed on the left, so its oldest message is on the right; kombu's
-- Redis transport takes a queue's next message with BRPOP (the right end): the message
-- is pushed on the right of its target, to be taken next. Its target list (the queue's
-- list for its priority, as kombu's _put names it) was written into its route header
-- when it was parked. Returns "moved <list>", "empty" or "unroutable", prefixed with
-- "again " when this job was done before (nothing moved now).
local before = redis.call('GET', KEYS[2])
if before then
  return 'again ' .. before
end
local result = 'empty'
local raw = redis.call('RPOP', KEYS[1])
if raw then
  local ok, message = pcall(cjson.decode, raw)
  local target = nil
  if ok and type(message) == 'table' and type(message.headers) == 'table' then
    local route = message.headers[ARGV[1]]
    if type(route) == 'table' and type(route.list) == 'string' and route.list ~= '' then
      target = ARGV[2] .. route.list
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
