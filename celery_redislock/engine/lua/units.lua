-- Weighted holders: shared by the scripts that write, renew or free slots. (This text is
-- put in front of those scripts when they are loaded; see scripts.py.)
--
-- A run of cost k holds k members of a semaphore, all with the same score (the end of its
-- lease): its holder member "token acquired_ms fence description" and k - 1 units
-- 'token*2' .. 'token*k'. A slot kept for a parked run of cost k is likewise '~~<n>' and
-- '~~<n>*2' .. '~~<n>*k' (parking.lua). So every count of used slots stays one ZCOUNT, units end
-- with their holder's lease, and a unit is told from a holder member by having no space.

local UNITS_PER_CALL = 500

-- ZADD `score` to the units 2..cost of `base` in `key` (flag: nil, or 'XX' to touch only
-- units that are there). Nothing is called for a cost of 1.
local function add_units(key, base, cost, score, flag)
  local first = 2
  while first <= cost do
    local last = math.min(cost, first + UNITS_PER_CALL - 1)
    local args = {'ZADD', key}
    if flag then args[#args + 1] = flag end
    for i = first, last do
      args[#args + 1] = score
      args[#args + 1] = base .. '*' .. i
    end
    redis.call(unpack(args))
    first = last + 1
  end
end

-- ZREM the units 2..cost of `base` from `key`. Nothing is called for a cost of 1.
local function remove_units(key, base, cost)
  local first = 2
  while first <= cost do
    local last = math.min(cost, first + UNITS_PER_CALL - 1)
    local args = {'ZREM', key}
    for i = first, last do args[#args + 1] = base .. '*' .. i end
    redis.call(unpack(args))
    first = last + 1
  end
end

-- The token of a holder member (the text before its first space).
local function token_of(member)
  return string.match(member, '^[^ ]*')
end

-- The cost of key i, given as ARGV[offset + i] (missing: 1).
local function cost_of(offset, i)
  return tonumber(ARGV[offset + i] or '1') or 1
end
