"""Every Lua script the client runs, in one place, and how it runs them.

Three scripts, each touching the keys of one cluster slot only (the shard
stream's): keys derived from a shard key with :func:`slot_key` carry the
shard key as their hash tag, so a script over a shard and its records is
valid on a Redis Cluster.

* :data:`IDEMPOTENT_XADD`: the publisher's check-and-append.  A dedup record
  (a hash: idempotency id -> entry id, and a sorted set of the same ids by
  time, which bounds it) says whether the id was appended already; if so the
  first entry id is returned and nothing is appended.
* :data:`IDEMPOTENT_XADD_MANY`: the same for many entries of one shard in
  one call (a ``publish_many`` batch): one script call, one clock read and
  one expiry scan for all of them, which is what makes it cheap.
* :data:`COMMIT`: a consumer's marker + ``XACK`` (+ ``XDEL``) + staged
  effects, after checking the shard's fencing token.  A marker that exists
  already turns the commit into an ack alone (a duplicate: effects skipped).

Redis scripts are atomic but not transactional: a command that fails half
way leaves the writes before it.  So each script checks first (fence, marker,
the type of every key it will write) and writes last, and the writes it does
cannot fail on a key of the right type except for a counter's value that is
not a number (docs/consumer.md, "Exactly-once effects").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

from redis.exceptions import NoScriptError, ResponseError

from streamkit.connections import AsyncRedis
from streamkit.routing import redis_cluster_slot

__all__ = [
    "COMMIT",
    "COMMIT_ACKS",
    "FENCED_ERROR",
    "IDEMPOTENT_XADD",
    "IDEMPOTENT_XADD_MANY",
    "READ_MARKED",
    "Script",
    "is_fenced",
    "is_noscript",
    "slot_key",
]


def slot_key(shard_key: str, suffix: str) -> str:
    """A key in the same cluster slot as ``shard_key``.

    ``{shard_key}:suffix`` for a key without a hash tag (streamkit's shard
    keys: stream prefixes may not contain braces), ``shard_key:suffix`` for
    one with a tag (it keeps the tag).
    """
    tag_start = shard_key.find("{")
    tagged = tag_start >= 0 and shard_key.find("}", tag_start + 1) > tag_start + 1
    key = f"{shard_key}:{suffix}" if tagged else f"{{{shard_key}}}:{suffix}"
    if redis_cluster_slot(key) != redis_cluster_slot(shard_key):
        raise ValueError(f"no key in the slot of {shard_key!r} can be derived from it")
    return key


class Script:
    """A Lua script sent by ``EVALSHA``; ``EVAL`` once after a ``NOSCRIPT``.

    The script is not loaded ahead: the first ``EVALSHA`` on a server that
    lacks it fails with ``NOSCRIPT`` and the caller sends :meth:`eval_command`
    instead, which also caches it there (a restart or failover empties the
    cache, so this can happen at any time).
    """

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def eval_command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        return ("EVAL", self.source, len(keys), *keys, *args)

    async def run(self, redis: AsyncRedis, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run it once (one round trip, two after a ``NOSCRIPT``)."""
        try:
            return await redis.execute_command(*self.command(keys, args))
        except ResponseError as exc:
            if not is_noscript(exc):
                raise
        return await redis.execute_command(*self.eval_command(keys, args))


def is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
    )


#: The error a commit of a fenced member gets (its token is not the shard's).
FENCED_ERROR: Final = "STREAMKIT_FENCED"


def is_fenced(reply: object) -> bool:
    return isinstance(reply, ResponseError) and FENCED_ERROR in str(reply)


# The idempotency record both publish scripts keep (KEYS: stream, dedup hash
# id -> entry id, dedup order: a sorted set of ids by ms).  ``now`` is the
# server's clock in ms.  ``forget_expired`` drops expired ids first (at most
# ``limit`` a call: each call adds few), so a repeat older than the window is
# appended again, as documented; ``bound`` keeps at most ``max_ids``.
_IDEMPOTENCE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function forget_expired(window_ms, limit)
  local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(window_ms),
                         'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('ZREM', KEYS[3], unpack(old))
    redis.call('HDEL', KEYS[2], unpack(old))
  end
end
local function xadd_head(maxlen)
  local head = {'XADD', KEYS[1], 'NOMKSTREAM'}
  if maxlen ~= '' then
    head[4] = 'MAXLEN'; head[5] = '~'; head[6] = maxlen
  end
  head[#head + 1] = '*'
  return head
end
local function remember(idem, id)
  redis.call('HSET', KEYS[2], idem, id)
  redis.call('ZADD', KEYS[3], now, idem)
end
local function bound(max_ids)
  local over = redis.call('ZCARD', KEYS[3]) - tonumber(max_ids)
  if over > 0 then
    local popped = redis.call('ZPOPMIN', KEYS[3], over)
    for i = 1, #popped, 2 do redis.call('HDEL', KEYS[2], popped[i]) end
  end
end
"""

# KEYS: stream, dedup hash (id -> entry id), dedup order (sorted set: id by ms)
# ARGV: id, window ms, max ids, maxlen ('' = none), then field, value, ...
# Returns {entry id, 0} when appended, {first entry id, 1} for a repeat, nil
# when the stream does not exist (NOMKSTREAM: the publisher's stale route).
IDEMPOTENT_XADD: Final = Script(
    "idempotent_xadd",
    _IDEMPOTENCE
    + """
forget_expired(ARGV[2], 8)
local first = redis.call('HGET', KEYS[2], ARGV[1])
if first then return {first, 1} end
local args = xadd_head(ARGV[4])
for i = 5, #ARGV do args[#args + 1] = ARGV[i] end
local id = redis.call(unpack(args))
if not id then return nil end
remember(ARGV[1], id)
bound(ARGV[3])
return {id, 0}
""",
)

# KEYS: stream, dedup hash, dedup order (as IDEMPOTENT_XADD)
# ARGV: window ms, max ids, maxlen ('' = none), entry count, then per entry:
#       id, argument count, field, value, ...
# Returns one reply per entry, as IDEMPOTENT_XADD's: {entry id, 0} appended,
# {first entry id, 1} a repeat (also of an id earlier in the same call), or
# false when the stream does not exist (nothing appended; a repeat is still
# answered from the record, as by the one-entry script).
# Each entry is checked and appended in order, as that many one-entry calls
# would be; the bound (max ids) is applied once at the end.
IDEMPOTENT_XADD_MANY: Final = Script(
    "idempotent_xadd_many",
    _IDEMPOTENCE
    + """
local count = tonumber(ARGV[4])
-- Bounded by what this call adds (as the one-entry script).
forget_expired(ARGV[1], count + 8)
local args = xadd_head(ARGV[3])
local nhead = #args
-- Every id's record in one HMGET and every new one in one HSET and one ZADD:
-- a call from Lua costs about as much as the work of one entry.
local ids, starts, i = {}, {}, 5
for c = 1, count do
  ids[c], starts[c] = ARGV[i], i
  i = i + 2 + tonumber(ARGV[i + 1])
end
local known = {}
for lo = 1, count, 1000 do
  local part = redis.call('HMGET', KEYS[2], unpack(ids, lo, math.min(lo + 999, count)))
  for n = 1, #part do known[lo + n - 1] = part[n] end
end
local replies, seen, pairs_, order = {}, {}, {}, {}
for c = 1, count do
  local idem = ids[c]
  local first = seen[idem] or known[c]
  if first then
    replies[c] = {first, 1}
  else
    -- One argument table for every XADD of the call (its head stays, the
    -- fields are written over): a table per entry was a tenth of the script.
    local s = starts[c]
    local m = tonumber(ARGV[s + 1])
    for j = 1, m do args[nhead + j] = ARGV[s + 1 + j] end
    local id = redis.call(unpack(args, 1, nhead + m))
    if id then
      seen[idem] = id
      pairs_[#pairs_ + 1] = idem
      pairs_[#pairs_ + 1] = id
      order[#order + 1] = now
      order[#order + 1] = idem
      replies[c] = {id, 0}
    else
      replies[c] = false
    end
  end
end
local added = #order / 2
for lo = 1, #pairs_, 1000 do
  redis.call('HSET', KEYS[2], unpack(pairs_, lo, math.min(lo + 999, #pairs_)))
  redis.call('ZADD', KEYS[3], unpack(order, lo, math.min(lo + 999, #order)))
end
if added > 0 then bound(ARGV[2]) end
return replies
""",
)

# The marker set both commit scripts keep, and READ_MARKED reads (KEYS[2]:
# a sorted set of idempotency ids by ms).  ``marks(ids, from, to)``: each id's
# ZMSCORE (false where none), in chunks of 1,000 (unpack's limit);
# ``add_and_bound(pairs, max)``: ZADD NX the ``{now, id, ...}`` pairs (a
# marker that exists keeps its time), then keep at most ``max`` markers (the
# oldest go first); returns how many were new.
_MARKERS: Final = """
local function marks(ids, from, to)
  local out = {}
  for lo = from, to, 1000 do
    local part = redis.call('ZMSCORE', KEYS[2], unpack(ids, lo, math.min(lo + 999, to)))
    for n = 1, #part do out[lo - from + n] = part[n] end
  end
  return out
end
local function add_and_bound(pairs, max_markers)
  local new = 0
  for lo = 1, #pairs, 1000 do
    new = new + redis.call('ZADD', KEYS[2], 'NX', unpack(pairs, lo, math.min(lo + 999, #pairs)))
  end
  local over = redis.call('ZCARD', KEYS[2]) - tonumber(max_markers)
  if over > 0 then redis.call('ZPOPMIN', KEYS[2], over) end
  return new
end
"""
# The opening of both commit scripts: the fence (ARGV[2], '' = unchecked,
# against KEYS[3]), the server's clock and the expiry of old markers (ARGV[3]).
_COMMIT_OPENING: Final = (
    _MARKERS
    + """
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return redis.error_reply('STREAMKIT_FENCED shard fencing token moved on; nothing committed')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[3]))
"""
)

# KEYS: stream, markers (sorted set: idempotency id by ms), fence, effect keys...
# ARGV: group, fence token ('' = unchecked), marker ttl ms, max markers,
#       commit count, then per commit: entry id, idempotency id, 'ack' | 'del',
#       effect count, then per effect: command, index of its key in KEYS,
#       argument count, arguments...
# Returns one reply per commit: 1 (committed), 0 (its marker existed: acked,
# effects skipped) or a refusal message (an effect on a key of another type:
# nothing of that commit written); or the FENCED error, nothing written at all.
# The acks go last, in one XACK: a commit is its effects and its marker, and a
# lost ack only means a redelivery that the marker answers.
COMMIT: Final = Script(
    "commit",
    _COMMIT_OPENING
    + """
local types = {HINCRBY='hash', HINCRBYFLOAT='hash', HSET='hash', HDEL='hash',
  INCRBY='string', INCRBYFLOAT='string', SET='string', DEL='', SADD='set', SREM='set',
  ZADD='zset', ZINCRBY='zset', ZREM='zset', XADD='stream', RPUSH='list', LPUSH='list',
  PEXPIRE=''}
local replies, acks, dels, commits, ids = {}, {}, {}, {}, {}
local i = 6
for c = 1, tonumber(ARGV[5]) do
  local count = tonumber(ARGV[i + 3])
  local commit = {entry = ARGV[i], idem = ARGV[i + 1], how = ARGV[i + 2], effects = {}}
  i = i + 4
  for n = 1, count do
    local argc = tonumber(ARGV[i + 2])
    local call = {ARGV[i], KEYS[tonumber(ARGV[i + 1])]}
    for j = 1, argc do call[j + 2] = ARGV[i + 2 + j] end
    commit.effects[n] = call
    i = i + 3 + argc
  end
  commits[c], ids[c] = commit, commit.idem
end
-- Every marker in one ZMSCORE, every new one in one ZADD: a call from Lua
-- costs about as much as the work of a small commit.
local marked = marks(ids, 1, #ids)
local seen, added = {}, {}
for c = 1, #commits do
  local commit, refused = commits[c], nil
  local effects = commit.effects
  if marked[c] or seen[commit.idem] then
    replies[c] = 0
  else
    -- Check every effect before writing anything: the type each key will
    -- have once the effects before it ran (an earlier one may create it).
    local planned = {}
    for n = 1, #effects do
      local cmd, key = effects[n][1], effects[n][2]
      local want = types[cmd]
      if want == nil then
        refused = 'ERR effect command not allowed: ' .. cmd
        break
      elseif cmd == 'DEL' then
        planned[key] = 'none'
      elseif want ~= '' then
        local have = planned[key] or redis.call('TYPE', key)['ok']
        if have ~= 'none' and have ~= want then
          refused = 'WRONGTYPE effect ' .. cmd .. ' on ' .. key .. ', a ' .. have ..
                    '; nothing committed'
          break
        end
        planned[key] = want
      end
    end
    if refused then
      replies[c] = refused
    else
      for n = 1, #effects do redis.call(unpack(effects[n])) end
      seen[commit.idem] = true
      added[#added + 1] = now
      added[#added + 1] = commit.idem
      replies[c] = 1
    end
  end
  if not refused then
    acks[#acks + 1] = commit.entry
    if commit.how == 'del' then dels[#dels + 1] = commit.entry end
  end
end
add_and_bound(added, ARGV[4])
if #acks > 0 then redis.call('XACK', KEYS[1], ARGV[1], unpack(acks)) end
if #dels > 0 then redis.call('XDEL', KEYS[1], unpack(dels)) end
return replies
""",
)

# KEYS: stream, markers (an idempotent listener's, see COMMIT).
# ARGV: group, consumer, count, the publisher's idempotency-id field name.
# An XREADGROUP of new entries (never BLOCK: a script cannot wait) and, for
# each entry, whether its idempotency id (the field's value, else the entry
# id) has a marker: {entries as XREADGROUP gives them, {1|0 per entry}}.
# One round trip where a read and a ZMSCORE were two; the commit checks the
# marker again, so this only decides whether a handler runs.
READ_MARKED: Final = Script(
    "read_marked",
    _MARKERS
    + """
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                     'STREAMS', KEYS[1], '>')
if not r then return {{}, {}} end
local entries, ids, flags = r[1][2], {}, {}
for i = 1, #entries do
  local id, fields = entries[i][1], entries[i][2]
  for j = 1, #fields, 2 do
    if fields[j] == ARGV[4] then
      if fields[j + 1] ~= '' then id = fields[j + 1] end
      break
    end
  end
  ids[i] = id
end
local found = marks(ids, 1, #ids)
for i = 1, #ids do flags[i] = found[i] and 1 or 0 end
return {entries, flags}
""",
)

# COMMIT for commits without staged effects (the common case), with the
# arguments laid out flat so the script walks no per-commit structure.
# KEYS: stream, markers, fence.  ARGV: group, fence token ('' = unchecked),
# marker ttl ms, max markers, commit count n, then n entry ids, n idempotency
# ids, the count of entries to delete and their ids.
# Returns how many markers it added (every entry is acked): the others found
# their marker (a duplicate; an id twice in one call counts once).  Which ones
# does not matter without effects, so no reply per commit is built or parsed;
# or the FENCED error, nothing written at all.
COMMIT_ACKS: Final = Script(
    "commit_acks",
    _COMMIT_OPENING
    + """
local n = tonumber(ARGV[5])
local ids, scored = 6 + n, {}
for k = 0, n - 1 do
  scored[2 * k + 1] = now
  scored[2 * k + 2] = ARGV[ids + k]
end
local added = add_and_bound(scored, ARGV[4])
for lo = 6, 5 + n, 1000 do
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, lo, math.min(lo + 999, 5 + n)))
end
local d = tonumber(ARGV[6 + 2 * n])
if d > 0 then redis.call('XDEL', KEYS[1], unpack(ARGV, 7 + 2 * n, 6 + 2 * n + d)) end
return added
""",
)
