-- The oldest waiter of some sub-lines of a fair line, for the operators' views (fair.lua
-- describes the keys; read-only). A tenant whose runs wait in priority bands keeps, per
-- band, the FIFO of its runs' scores ('since - band x aging') and a sorted set of its
-- bands by their head's score: the head of each band is its oldest run, so a tenant's
-- oldest waiter is the least of 'score + band x aging' over its bands' heads, read here
-- in O(log bands) per band. A tenant whose runs wait without a band keeps no such FIFO:
-- it returns no band (its oldest waiter is unknown).
--
-- KEYS[1] the semaphore   ARGV[1] at most this many bands per tenant   ARGV[2..] tenants
--
-- Returns {now_ms, n1, band, score, ..., n2, band, score, ...}: per tenant in ARGV's
-- order, how many bands it has read, then each band and its head's score.

local now = redis.call('TIME')
local out = {tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
local most = math.max(1, tonumber(ARGV[1]) or 16)
local heads = fair_key(KEYS[1], 'fb')
for at = 2, #ARGV do
  local bands = redis.call('ZRANGE', heads .. ':' .. ARGV[at], 0, most - 1, 'WITHSCORES')
  out[#out + 1] = #bands / 2
  for index = 1, #bands do out[#out + 1] = bands[index] end
end
return out
