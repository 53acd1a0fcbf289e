-- Give back every slot held by members that start with a prefix, in N leased semaphores,
-- and hand the freed slots to their parked lines (store.lua, units.lua, fair.lua,
-- parked_cost.lua, parking.lua, deadline.lua and line.lua are put in front of this
-- script). The units of a weighted holder ('token*2'...) go with it: they match
-- a prefix as their holder member "token ..." does.
--
-- Holder members of task runs start "<worker node>|<task id>|<start id>:", the start id
-- being one start of that worker (older members have no "<start id>:"), so a worker's
-- main process can free the slots of a pool child that died without running its own
-- cleanup (prefix "<node>|<task id>|<start id>:"), what it still holds as it exits
-- (mode 'own'), or what its previous lives held (mode 'dead'), never touching the slots of
-- a live worker of the same node name.
--
-- KEYS[i]   semaphore i (see admit.lua)
-- ARGV[1]   member prefix
-- ARGV[2]   how long a slot handed to a parked line stays reserved for it (ms), or 0
-- ARGV[3]   '' (every member with the prefix), 'own' (only those of start ARGV[4]) or
--           'dead' (only those of a start that is not live, or of no start)
-- ARGV[4]   'own': the start id; 'dead': the start of the registry keys of the node's
--           starts ('<prefix>worker:<node>:'; a start is live while its key exists), or ''
--           (on Redis Cluster, where those keys may live on another node)
-- ARGV[5..] 'dead': start ids to take as live whatever the registry says
--
-- Every member freed is remembered (hash '}:l:', member -> ms, for LOST_MEMORY ms), so a
-- redelivered copy of its run's message that follows it (follow.lua) tells a run that
-- died from one that ended.
--
-- Returns {freed, move...}: how many slots were freed (a weighted holder's units
-- counted), and the moves owed out of the parking queues of the lines handed a slot
-- ('!move <count> <key>', see parking.lua).

local prefix = ARGV[1]
local reserve = tonumber(ARGV[2] or '0')
local mode = ARGV[3] or ''
local freed = 0
local handed = {}
local now = server_now()
local live = {}
for i = 5, #ARGV do live[ARGV[i]] = true end

local function start_of(member)
  return string.match(member, '^[^|]*|[^|]*|([^:| ]*):')
end

local function is_live(start)
  if live[start] == nil then
    live[start] = ARGV[4] ~= '' and redis.call('EXISTS', ARGV[4] .. start) == 1
  end
  return live[start]
end

-- A unit 'token*2' reads as its holder's "token " (units.lua); other members as they are.
local function as_holder(member)
  if string.find(member, ' ', 1, true) then return member end
  local token = string.match(member, '^(.+)%*%d+$')
  if token then return token .. ' ' end
  return member
end

local function frees(member)
  member = as_holder(member)
  if string.sub(member, 1, #prefix) ~= prefix then return false end
  if mode == '' then return true end
  local start = start_of(member)
  if mode == 'own' then return start == ARGV[4] end
  return start == nil or not is_live(start)
end
local LOST_MEMORY = 600000

for i = 1, #KEYS do
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[i], 0, '+inf')) do
    if frees(member) then
      redis.call('ZREM', KEYS[i], member)
      if string.find(member, ' ', 1, true) then  -- a holder member, not a unit
        local lost = companion(KEYS[i], 'l')
        redis.call('HSET', lost, member, now)
        redis.call('PEXPIRE', lost, LOST_MEMORY)
      end
      freed = freed + 1
    end
  end
  serve_line(KEYS[i], now, reserve, handed)
end
local answer = {freed}
for _, message in ipairs(handed) do answer[#answer + 1] = message end
return answer
