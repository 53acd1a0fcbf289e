-- The fair sub-lines of one semaphore, for the operators' views (fair.lua describes the
-- keys): the number of sub-lines waiting, the virtual time, and the first `top` by turn
-- with their turn, messages waiting and weight. Reads O(top) entries, never a walk.
--
-- KEYS[1] the semaphore        ARGV[1] how many sub-lines to show (top N)
--
-- Returns {waiting sub-lines, virtual time, sub, turn, waiting, weight, sub, ...}.

local turns, state = fair_key(KEYS[1], 'ft'), fair_key(KEYS[1], 'fn')
local weights = fair_key(KEYS[1], 'fw')
local out = {redis.call('ZCARD', turns), redis.call('HGET', state, 'v') or '0'}
local top = math.max(0, tonumber(ARGV[1]) or 10)
if top == 0 then return out end
local first = redis.call('ZRANGE', turns, 0, top - 1, 'WITHSCORES')
for at = 1, #first, 2 do
  local sub = first[at]
  out[#out + 1] = sub
  out[#out + 1] = first[at + 1]
  out[#out + 1] = redis.call('HGET', state, 'w:' .. sub) or '0'
  out[#out + 1] = redis.call('HGET', weights, sub) or '1'
end
return out
