"""Every Lua script of the coordinator's Redis layout, in one place.

Each script touches the keys of one hash slot only (Redis Cluster).  The
comments above each say its KEYS, ARGV and reply; the callers register them
once (redis-py sends EVALSHA and reloads on NOSCRIPT).
"""

from __future__ import annotations

# Shared by the load and steady-write scripts: the member ids that the writes
# after the caller's copy (revision ``have``, writeId ``wid``) up to revision
# ``cur`` wrote, or nil unless the write log proves the chain: every entry
# still there, the copy's own entry with its writeId, every later write a
# member-only one, and (``mine`` given) none of them a write of those members.
# ``add_records`` appends each of those ids with its ``m:<id>`` record (both
# scripts reply with them, so the caller's copy catches up).
WRITES_SINCE = """
local function writes_since(key, have, wid, cur, size, mine)
  if not (have and cur and size and cur > have and cur - have < size) then return nil end
  local ids = {}
  for r = have, cur do
    local raw = redis.call('HGET', key, 'log:' .. string.format('%d', r % size))
    local e = raw and cjson.decode(raw)
    if not e or e[1] ~= r or (r == have and e[2] ~= wid) or (r > have and e[3] ~= 0) then
      return nil
    end
    if r > have then
      for _, id in ipairs(e[4]) do
        if mine and mine[id] then return nil end
        ids[#ids + 1] = id
      end
    end
  end
  return ids
end

local function add_records(reply, key, ids)
  for _, id in ipairs(ids) do
    reply[#reply + 1] = id
    reply[#reply + 1] = redis.call('HGET', key, 'm:' .. id) or false
  end
  return reply
end
"""

# KEYS: mutex, metadata.  ARGV: token ('' = read without locking), ttl ms,
# the (revision, writeId) of the copy the caller has parsed already, the size
# of the write log.  Reply: {0} mutex busy; {2, exists} no group; otherwise
# {1, revision, schemaVersion, layoutVersion, updatedAt, writeId, mode, ...}
# where mode is 'same' (the caller's copy is current), 'delta' (member id /
# record pairs written since the caller's copy: only member-only writes since),
# 'full' (every field of the hash) or 'v1' (the v1 aggregate).
LOAD = """
if ARGV[1] ~= '' then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
local m = redis.call('HMGET', KEYS[2], 'revision', 'schemaVersion', 'layoutVersion',
  'updatedAt', 'writeId')
if not m[1] then
  if ARGV[1] ~= '' then redis.call('DEL', KEYS[1]) end
  return {2, redis.call('EXISTS', KEYS[2])}
end
local head = {1, m[1], m[2] or false, m[3] or false, m[4] or false, m[5] or false}
if m[3] == '1' then
  head[7] = 'v1'
  head[8] = redis.call('HGET', KEYS[2], 'aggregate') or false
  return head
end
if m[3] ~= '2' then head[7] = 'unsupported' return head end
if m[1] == ARGV[3] and m[5] == ARGV[4] then head[7] = 'same' return head end
local ids = writes_since(KEYS[2], tonumber(ARGV[3]), ARGV[4], tonumber(m[1]), tonumber(ARGV[5]))
if ids then
  head[7] = 'delta'
  return add_records(head, KEYS[2], ids)
end
head[7] = 'full'
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all do head[7 + i] = all[i] end
return head
"""

# KEYS: mutex, metadata.  ARGV: as LOAD (the token, ttl, then the (revision,
# writeId) of the caller's copy, which it computed the write from, the size of
# the write log), the writeId of this write, then the field/value pairs of a
# member-only write (``m:<memberId>`` records).  When nobody holds the mutex
# and the write is still valid, the script writes the records, the next
# revision, the writeId and that revision's log entry, and replies {3,
# revision, id, record, ...}: a steady heartbeat in one round trip.  Valid
# means Redis holds exactly the caller's copy, or a later state reached from
# it by member-only writes (the write log proves the chain) that touched none
# of the records being written; the reply then carries the records those
# writes touched, so the caller's copy becomes exactly what Redis now holds.
# Why a write decided on such a copy stands: a steady answer reads the group
# document and its own member's record, and both are as they were (see
# docs/concepts.md, "How a group is stored").  The free mutex is courtesy: a
# critical section in progress would otherwise lose its own CAS.  Otherwise
# the script goes on as LOAD (takes the mutex, reads), so falling back costs
# no extra round trip.
STEADY_PRELUDE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  local c = redis.call('HMGET', KEYS[2], 'revision', 'writeId', 'layoutVersion')
  local have, cur, size = tonumber(ARGV[3]), tonumber(c[1]), tonumber(ARGV[5])
  if c[3] == '2' and have and cur then
    local mine, ids = {}, {}
    for i = 7, #ARGV, 2 do
      local id = string.sub(ARGV[i], 3)
      mine[id] = true
      ids[#ids + 1] = id
    end
    local others = {}
    if c[1] ~= ARGV[3] or c[2] ~= ARGV[4] then
      others = writes_since(KEYS[2], have, ARGV[4], cur, size, mine)
    end
    if others then
      local rev = string.format('%d', cur + 1)
      redis.call('HSET', KEYS[2], 'revision', rev, 'writeId', ARGV[6],
        'log:' .. string.format('%d', (cur + 1) % size), cjson.encode({cur + 1, ARGV[6], 0, ids}))
      for i = 7, #ARGV, 1000 do
        redis.call('HSET', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
      end
      return add_records({3, rev}, KEYS[2], others)
    end
  end
end
"""

# KEYS: metadata, mutex.  ARGV: expected revision ('' = create, only if the key
# is absent), mutex token, the stamp mode (below), then the fields to set as
# pairs, an empty string, then the fields to delete.  The caller sends
# revision, writeId and the log entry of the new revision among the fields (it
# knows the new revision: the expected one plus one).  The mutex is released
# in the same round trip whether or not the write happened.
#
# The stamp: every document write records which Redis server incarnation took
# it (run_id, new on every restart, and replication id, new on every promotion
# of a replica).  A document write (mode 'check') that finds another stamp is
# refused with {2}: Redis failed over, restarted or was restored since the
# last one, and may have lost writes that this coordinator process never saw
# (another process made them), which no revision number can show.  The caller
# then opens a correction round and writes it with mode 'restamp'.  Grants are
# document writes, so none happens on a changed server before the round; a
# member-only write (mode '') changes no ownership and pays nothing.  INFO
# must be allowed in scripts: failing closed beats a check that does nothing.
COMMIT = """
local cur = redis.call('HGET', KEYS[1], 'revision')
local ok
if ARGV[1] == '' then ok = redis.call('EXISTS', KEYS[1]) == 0 else ok = cur == ARGV[1] end
local server
if ok and ARGV[3] ~= '' then
  local info = redis.call('INFO', 'server', 'replication')
  server = (string.match(info, 'run_id:(%w+)') or '') .. ':' ..
    (string.match(info, 'master_replid:(%w+)') or '')
  local stamp = redis.call('HGET', KEYS[1], 'redisServer')
  if ARGV[3] == 'check' and stamp and stamp ~= server then
    if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
    return {2}
  end
end
if ok then
  -- In chunks: unpack() of a whole 10,000-member group would overflow Lua's stack.
  local sets, i = {}, 4
  if server then sets = {'redisServer', server} end
  while ARGV[i] ~= '' do
    sets[#sets + 1] = ARGV[i]
    sets[#sets + 1] = ARGV[i + 1]
    i = i + 2
    if #sets >= 1000 then redis.call('HSET', KEYS[1], unpack(sets)) sets = {} end
  end
  if #sets > 0 then redis.call('HSET', KEYS[1], unpack(sets)) end
  for j = i + 1, #ARGV, 1000 do
    redis.call('HDEL', KEYS[1], unpack(ARGV, j, math.min(j + 999, #ARGV)))
  end
end
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
if ok then return 1 end
return {0, cur}
"""

# KEYS: metadata, mutex.  ARGV: expected revision, mutex token.
DELETE = """
local ok = redis.call('HGET', KEYS[1], 'revision') == ARGV[1]
if ok then redis.call('DEL', KEYS[1]) end
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
if ok then return 1 end
return 0
"""

# KEYS: mutex.  ARGV: token.  Compare-and-delete: only the owner releases.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: a mutex.  ARGV: token, ttl ms.  Extends the TTL only for its owner.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS: stream layout hash.  ARGV: field/value pairs.  Create only if absent.
CREATE_HASH = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


# Used by ``coordination/drain.py``.
# KEYS: one shard stream.  ARGV: 'probe' or 'retire', then the names of the
# coordinator's groups of the stream.
DRAIN = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return 1 end
if t ~= 'stream' then
  return redis.error_reply('WRONGTYPE shard key ' .. KEYS[1] .. ' holds a ' .. t)
end
local seen = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  -- A nil lag arrives as false: unknown is not zero.
  if f['pending'] ~= 0 or f['lag'] ~= 0 then return 0 end
  seen[f['name']] = true
end
-- A coordinator group whose Redis group is gone from a non-empty key never
-- read these entries; deleting the key would lose them for it.
if redis.call('XLEN', KEYS[1]) > 0 then
  for i = 2, #ARGV do
    if not seen[ARGV[i]] then return -1 end
  end
end
if ARGV[1] == 'retire' then redis.call('UNLINK', KEYS[1]) end
return 1
"""


# Used by ``store/provisioning.py``.
# KEYS: one shard stream.  ARGV: consumer group ('' = only make sure the empty
# stream exists), placeholder group name.  One script per key, so it is atomic
# and single-slot.  A new stream is created through XGROUP CREATE MKSTREAM
# (Redis has no "create empty stream" command); without a real group, a
# placeholder group is created and destroyed in the same script, so it can
# never be left behind.
PROVISION = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('WRONGTYPE shard key ' .. KEYS[1] .. ' holds a ' .. t)
end
if ARGV[1] == '' then
  if t == 'none' then
    redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[2], '$', 'MKSTREAM')
    redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[2])
    return 1
  end
  return 0
end
local r = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
if type(r) == 'table' and r.err then
  if string.find(r.err, 'BUSYGROUP', 1, true) then return 0 end
  return r
end
return 1
"""


# Used by ``auth/ratelimit.py``.
# KEYS[1] counter; ARGV: window ms, limit, cost.  Returns the window's
# remaining ms once the count exceeds the limit, else -1.
RATE_WINDOW = """
local cost = tonumber(ARGV[3])
local count
if cost > 0 then
  count = redis.call('INCRBY', KEYS[1], cost)
  if count == cost then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
else
  count = tonumber(redis.call('GET', KEYS[1]) or '0')
end
if count > tonumber(ARGV[2]) then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
  return ttl
end
return -1
"""


# Used by ``coordination/timings.py``.
# Atomic, so two processes starting together cannot both miss each other.
# Uses the server's clock: coordinator hosts may disagree about the time.
# ARGV: coordinator id, encoded timings, how long the entry binds (ms).
# Reply: {1} registered, or {0, id, their timings, ms they still bind, stopped}.
# Timings are compared setting by setting, over the settings both entries
# name: a later release may add a setting (its old behaviour as the default)
# and still run beside this one (docs/operations.md, "Upgrades and rollbacks").
REGISTER_TIMINGS = """
local function settings(encoded)
  local out = {}
  for name, value in string.gmatch(encoded, '([^,=]+)=([^,]*)') do out[name] = value end
  return out
end
local function agree(a, b)
  local mine, theirs, common = settings(a), settings(b), 0
  for name, value in pairs(mine) do
    if theirs[name] ~= nil then
      if theirs[name] ~= value then return false end
      common = common + 1
    end
  end
  return common > 0
end
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local id, value = entries[i], entries[i + 1]
  local sep = string.find(value, '|', 1, true)
  local bound = sep and tonumber(string.sub(value, 1, sep - 1)) or 0
  local rest = sep and string.sub(value, sep + 1) or ''
  local stop = string.find(rest, '|', 1, true)
  local timings = stop and string.sub(rest, 1, stop - 1) or rest
  if bound < now then
    redis.call('HDEL', KEYS[1], id)
  elseif id ~= ARGV[1] and not agree(timings, ARGV[2]) then
    return {0, id, timings, bound - now, stop and 1 or 0}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[3])) .. '|' .. ARGV[2])
return {1}
"""


# Used by ``coordination/retention.py``; the rules are ``core/retention.py``.
# KEYS: one shard stream.  ARGV: max age ms ('' = no age rule), max length
# ('' = no length rule), the most entries the length rule may read per call
# (the rest waits for the next call), then the names of the coordinator's
# groups of the stream.  Reply: {trimmed, now ms, length cut id or '', floor id
# or '', holding group or '', more, blocked}: ``more`` = 1 when the length rule
# had more to trim than it could look at; ``blocked`` = 1 when the policy
# wanted more than the groups allow (then the length cut is not looked for
# beyond the floor, and may be '').
# Atomic on purpose: a group that is created, reads or claims between a
# separate check and the XTRIM could otherwise lose entries.  The floor of a
# group is min(last-delivered-id, oldest pending id): its last delivered entry
# stays too, so no "next id" arithmetic on Lua's doubles is needed.
RETAIN = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {0, 0, '', '', '', 0, 0} end
if t ~= 'stream' then
  return redis.error_reply('WRONGTYPE shard key ' .. KEYS[1] .. ' holds a ' .. t)
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local len = redis.call('XLEN', KEYS[1])
if len == 0 then return {0, now, '', '', '', 0, 0} end
local function parse(id)
  local d = string.find(id, '-', 1, true)
  return {tonumber(string.sub(id, 1, d - 1)), tonumber(string.sub(id, d + 1))}
end
local function less(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function show(a) return string.format('%d-%d', a[1], a[2]) end
-- The oldest id some group still needs.
local floor, holder = nil, ''
local seen = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  seen[f['name']] = true
  local need = parse(f['last-delivered-id'])
  if f['pending'] > 0 then
    local p = redis.call('XPENDING', KEYS[1], f['name'])
    if p[2] then
      local low = parse(p[2])
      if less(low, need) then need = low end
    end
  end
  if floor == nil or less(need, floor) then floor, holder = need, f['name'] end
end
for i = 4, #ARGV do
  -- A coordinator group without its Redis group here never read this shard.
  if not seen[ARGV[i]] then floor, holder = {0, 0}, ARGV[i] break end
end
-- What the policy wants: the more trimming of the two rules.
local wanted = nil
if ARGV[1] ~= '' then wanted = {math.max(0, now - tonumber(ARGV[1])), 0} end
local blocked = floor ~= nil and wanted ~= nil and less(floor, wanted)
local cut, more, cap_by_length = nil, 0, false
if not blocked and ARGV[2] ~= '' and len > tonumber(ARGV[2]) then
  local maxlen, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
  -- Cheap first: at most maxLength entries at or after the floor means
  -- XTRIM MAXLEN keeps all of them (Redis finds the cut itself); more than
  -- maxLength means the cut lies beyond the floor (blocked).  Only the
  -- entries after the floor are read, which are few while groups keep up.
  local known = floor == nil
  if known then cap_by_length = true else
    local n = math.min(maxlen, cap)
    local tail = redis.call('XRANGE', KEYS[1], show(floor), '+', 'COUNT', n + 1)
    if #tail <= n then cap_by_length, known = true, true
    elseif n == maxlen then blocked, known = true, true end
  end
  if not known then
    -- Too many to tell from the tail: look for the cut from the head, up to
    -- the floor only (the rest waits for the next call).
    local drop = len - maxlen
    if drop > cap then drop, more = cap, 1 end
    local head = redis.call('XRANGE', KEYS[1], '-', show(floor), 'COUNT', drop + 1)
    if #head == drop + 1 then
      cut = parse(head[drop + 1][1])
      if wanted == nil or less(wanted, cut) then wanted = cut end
    else
      blocked, more = true, 0
    end
  end
end
local shown_cut = cut and show(cut) or ''
local shown_floor = floor and show(floor) or ''
if blocked then
  local trimmed = redis.call('XTRIM', KEYS[1], 'MINID', '=', shown_floor)
  return {trimmed, now, shown_cut, shown_floor, holder, 0, 1}
end
local trimmed = 0
if cap_by_length then trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', '=', ARGV[2]) end
if wanted ~= nil then
  trimmed = trimmed + redis.call('XTRIM', KEYS[1], 'MINID', '=', show(wanted))
end
return {trimmed, now, shown_cut, shown_floor, holder, more, 0}
"""
