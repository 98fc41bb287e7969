"""The Redis metadata store (SPEC §3 "Redis layout").

Keys (``kp`` = key prefix, default ``redis-stream:coord``):

* ``{kp}:{<streamPrefix>:<consumerGroup>}:metadata`` -- hash (layout 2):
  ``group`` (the group document: GroupMetadata JSON without its members),
  ``m:<memberId>`` (one MemberMetadata JSON per member), ``revision``
  (storeRevision, bumped by every write), ``writeId`` (random id of that
  write), ``log:<revision % 64>`` (which member records each recent write
  touched, or that it wrote the document), ``schemaVersion``,
  ``layoutVersion``, ``updatedAt``, ``redisServer`` (the Redis server
  incarnation that wrote the document last: see ``_COMMIT``).  The source of
  truth.  No TTL, ever.
  Layout 1 kept the whole group in one ``aggregate`` field; such a group is
  read as is and rewritten as layout 2 on its next write (under the mutex).
* ``{kp}:{<streamPrefix>:<consumerGroup>}:mutex`` -- the group mutex; the same
  hash tag puts it in the metadata's slot so one Lua script can touch both.
* ``{kp}:{<streamPrefix>}:stream`` -- hash describing the stream
  (``shardCount``, ``layout``, ``ordering``, ``groups`` ...; see
  ``streams.StreamRecord``), written by stream/group creation and deletion and
  by every layout switch.
* ``{kp}:{<streamPrefix>}:stream-lock`` -- mutex for stream-wide changes
  (creation, scale, rollback, shard retirement).
* ``{kp}:groups`` -- set of ``<streamPrefix>\\0<consumerGroup>``: an index for
  listing and ticking, rebuildable by SCAN, never a source of truth.  It lives
  in its own slot, so it is only ever touched by single-key commands.

Writes are revision CAS scripts; every script touches keys of one slot only.
A steady heartbeat's write sends only its member's record (see
docs/concepts.md, "How a group is stored", for why that is as safe as
rewriting the group).
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

import redis.asyncio
from redis.commands.core import AsyncScript

from streamkit_server.core import (
    LAYOUT_VERSION,
    SCHEMA_VERSION,
    Change,
    GroupMetadata,
    MemberMetadata,
    MemberRemoved,
    MemberUpserted,
    steady,
)
from streamkit_server.metrics import Metrics
from streamkit_server.script_batch import ScriptBatcher

__all__ = [
    "INDEX_SEPARATOR",
    "CommitResult",
    "GroupKeys",
    "Loaded",
    "MetadataCorrupt",
    "MetadataStore",
    "MetadataUnsupported",
    "MutexBusy",
    "RedisClient",
    "StoreError",
]

log = logging.getLogger("streamkit_server.store")

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster

INDEX_SEPARATOR: Final = "\x00"

#: Entries of the write log kept in each group hash (one per revision, in a
#: ring).  A process whose parsed copy is at most this many revisions old
#: catches up by reading only the member records written since.
WRITE_LOG_SIZE: Final = 64

# Shared by the load and steady-write scripts: the member ids that the writes
# after the caller's copy (revision ``have``, writeId ``wid``) up to revision
# ``cur`` wrote, or nil unless the write log proves the chain: every entry
# still there, the copy's own entry with its writeId, every later write a
# member-only one, and (``mine`` given) none of them a write of those members.
_WRITES_SINCE = """
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
"""

# KEYS: mutex, metadata.  ARGV: token ('' = read without locking), ttl ms,
# the (revision, writeId) of the copy the caller has parsed already, the size
# of the write log.  Reply: {0} mutex busy; {2, exists} no group; otherwise
# {1, revision, schemaVersion, layoutVersion, updatedAt, writeId, mode, ...}
# where mode is 'same' (the caller's copy is current), 'delta' (member id /
# record pairs written since the caller's copy: only member-only writes since),
# 'full' (every field of the hash) or 'v1' (the v1 aggregate).
_LOAD = """
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
  for _, id in ipairs(ids) do
    head[#head + 1] = id
    head[#head + 1] = redis.call('HGET', KEYS[2], 'm:' .. id) or false
  end
  return head
end
head[7] = 'full'
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all do head[7 + i] = all[i] end
return head
"""

# KEYS: mutex, metadata.  ARGV: as _LOAD (the token, ttl, then the (revision,
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
# the script goes on as _LOAD (takes the mutex, reads), so falling back costs
# no extra round trip.
_STEADY_PRELUDE = """
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
      local reply = {3, rev}
      for _, id in ipairs(others) do
        reply[#reply + 1] = id
        reply[#reply + 1] = redis.call('HGET', KEYS[2], 'm:' .. id) or false
      end
      return reply
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
_COMMIT = """
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
_DELETE = """
local ok = redis.call('HGET', KEYS[1], 'revision') == ARGV[1]
if ok then redis.call('DEL', KEYS[1]) end
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
if ok then return 1 end
return 0
"""

# KEYS: mutex.  ARGV: token.  Compare-and-delete: only the owner releases.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: a mutex.  ARGV: token, ttl ms.  Extends the TTL only for its owner.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS: stream layout hash.  ARGV: field/value pairs.  Create only if absent.
_CREATE_HASH = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


class StoreError(Exception):
    """Metadata exists but cannot be used: fail closed."""

    error_code = "METADATA_CORRUPT"


class MetadataUnsupported(StoreError):
    error_code = "METADATA_SCHEMA_UNSUPPORTED"


class MetadataCorrupt(StoreError):
    error_code = "METADATA_CORRUPT"


class MutexBusy(Exception):
    """The group mutex is held by someone else (``load`` with a token)."""


@dataclass(frozen=True, slots=True)
class GroupKeys:
    stream_prefix: str
    consumer_group: str
    metadata: str
    mutex: str

    @property
    def index_member(self) -> str:
        return f"{self.stream_prefix}{INDEX_SEPARATOR}{self.consumer_group}"


@dataclass(frozen=True, slots=True)
class Loaded:
    """One group as read from Redis. ``group`` must be treated as immutable."""

    keys: GroupKeys
    revision: int
    #: Random id of the write that produced ``revision``: after a restore the
    #: same revision number can come back with other contents.
    write_id: str
    updated_at: str
    group: GroupMetadata
    #: The layout found in Redis; a v1 group is rewritten as v2 on its next write.
    layout_version: int = LAYOUT_VERSION


@dataclass(frozen=True, slots=True)
class CommitResult:
    ok: bool
    revision: int | None
    loaded: Loaded | None
    #: Refused: another Redis server incarnation stamped the group last.
    server_changed: bool = False


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


# Write ids and mutex tokens need only be unique (no one guesses them: every
# writer is a coordinator).  A random per-process prefix and a counter are
# that, without a system call for random bytes twice per heartbeat.
_ID_PREFIX: Final = secrets.token_hex(6)
_ID_COUNTER = itertools.count()


def unique_id() -> str:
    """A write id or mutex token no other write or holder has, in any process."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):x}"


class MetadataStore:
    def __init__(self, client: RedisClient, key_prefix: str, metrics: Metrics) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.metrics = metrics
        self.index_key = f"{key_prefix}:groups"
        # Registered once; redis-py sends EVALSHA and reloads on NOSCRIPT.
        self._load: AsyncScript = client.register_script(_WRITES_SINCE + _LOAD)
        self._steady: AsyncScript = client.register_script(_WRITES_SINCE + _STEADY_PRELUDE + _LOAD)
        # Concurrent steady writes (of any groups) share a round trip.
        self._steady_batch = ScriptBatcher(client, self._steady, metrics.steady_pipeline_sizes)
        self._commit: AsyncScript = client.register_script(_COMMIT)
        self._delete: AsyncScript = client.register_script(_DELETE)
        self._release: AsyncScript = client.register_script(_RELEASE)
        self._create_hash: AsyncScript = client.register_script(_CREATE_HASH)
        self._renew: AsyncScript = client.register_script(_RENEW)
        # Parse cache only: an entry is used when Redis still holds its
        # (revision, writeId), or brought up to date from the member records
        # written since (the write log proves nothing else changed).
        self._parsed: dict[str, Loaded] = {}

    # -- keys ----------------------------------------------------------------

    def group_keys(self, stream_prefix: str, consumer_group: str) -> GroupKeys:
        tag = f"{{{stream_prefix}:{consumer_group}}}"
        return GroupKeys(
            stream_prefix=stream_prefix,
            consumer_group=consumer_group,
            metadata=f"{self.key_prefix}:{tag}:metadata",
            mutex=f"{self.key_prefix}:{tag}:mutex",
        )

    def stream_record_key(self, stream_prefix: str) -> str:
        return f"{self.key_prefix}:{{{stream_prefix}}}:stream"

    def stream_lock_key(self, stream_prefix: str) -> str:
        return f"{self.key_prefix}:{{{stream_prefix}}}:stream-lock"

    # -- group metadata ------------------------------------------------------

    async def load(self, keys: GroupKeys, token: str = "", ttl_ms: int = 0) -> Loaded | None:
        """Read a group; with ``token`` also take its mutex in the same round trip.

        Returns ``None`` when the metadata key does not exist.  Raises
        ``MutexBusy`` when ``token`` was given and the mutex is held by someone
        else, ``StoreError`` when the metadata cannot be trusted (the mutex is
        then given back).
        """
        try:
            try:
                return await self._load_once(keys, token, ttl_ms)
            except _StaleCache:
                # Read everything instead; a mutex asked for is ours already.
                self._parsed.pop(keys.metadata, None)
                return await self._load_once(keys, "", 0)
        except StoreError:
            if token:
                await self.release(keys.mutex, token)
            self.metrics.schema_errors.inc()
            raise

    async def _load_once(self, keys: GroupKeys, token: str, ttl_ms: int) -> Loaded | None:
        cached = self._parsed.get(keys.metadata)
        reply = await self._load(
            keys=[keys.mutex, keys.metadata], args=[token, ttl_ms, *_known(cached), WRITE_LOG_SIZE]
        )
        return self._loaded(keys, cached, reply)

    def _loaded(
        self, keys: GroupKeys, cached: Loaded | None, reply: Sequence[Any]
    ) -> Loaded | None:
        """A ``_LOAD`` reply as a group (``cached``: the copy the script was told of)."""
        status = int(reply[0])
        if status == 0:
            raise MutexBusy(keys.mutex)
        if status == 2:
            self._parsed.pop(keys.metadata, None)
            if int(reply[1]):
                raise MetadataCorrupt(f"metadata hash {keys.metadata} has no revision field")
            return None
        revision_raw, schema, layout, updated_raw, write_raw, mode_raw = reply[1:7]
        mode = _s(mode_raw)
        if schema is None or _s(schema) != str(SCHEMA_VERSION) or mode == "unsupported":
            raise MetadataUnsupported(
                f"group metadata {keys.metadata} has schemaVersion={_opt(schema)} "
                f"layoutVersion={_opt(layout)}; this coordinator understands "
                f"schemaVersion={SCHEMA_VERSION} with layoutVersion 1 (upgraded on the next "
                f"write) or {LAYOUT_VERSION}"
            )
        try:
            revision = int(revision_raw)
        except ValueError as exc:
            raise MetadataCorrupt(f"metadata {keys.metadata} has a non-numeric revision") from exc
        updated_at = _s(updated_raw) if updated_raw is not None else ""
        write_id = _s(write_raw) if write_raw is not None else ""
        try:
            if mode == "same":
                assert cached is not None
                return cached
            if mode == "delta":
                assert cached is not None
                group = _apply_delta(cached.group, reply[7:])
                loaded = Loaded(keys, revision, write_id, updated_at, group)
            elif mode == "v1":
                if reply[7] is None:
                    raise MetadataCorrupt(f"metadata {keys.metadata} has no aggregate")
                group = GroupMetadata.model_validate_json(reply[7])
                loaded = Loaded(keys, revision, write_id, updated_at, group, layout_version=1)
            else:
                loaded = Loaded(keys, revision, write_id, updated_at, _parse_full(reply[7:]))
        except ValueError as exc:
            raise MetadataCorrupt(
                f"metadata {keys.metadata} holds a record that does not parse"
            ) from exc
        self._parsed[keys.metadata] = loaded
        return loaded

    def cached(self, keys: GroupKeys) -> Loaded | None:
        """This process's parsed copy of a group (possibly stale: only a write proves it)."""
        return self._parsed.get(keys.metadata)

    async def commit_steady(
        self,
        cached: Loaded,
        group: GroupMetadata,
        changes: Sequence[Change],
        token: str,
        ttl_ms: int,
    ) -> CommitResult | Loaded | None:
        """A member-only write computed from ``cached``, in one round trip when it is current.

        Writes ``changes`` (``steady``, taken from ``group``) if Redis still
        holds ``cached``'s revision and write id and no one holds the mutex:
        returns the ``CommitResult``.  Otherwise nothing is written and this is
        ``load(keys, token, ttl_ms)`` (same answers, same ``MutexBusy``): the
        caller recomputes under the mutex from what it returns.
        """
        keys = cached.keys
        if cached.layout_version != LAYOUT_VERSION or not steady(changes):
            raise ValueError("commit_steady takes member-only changes to a layout-2 group")
        write_id = unique_id()
        records = _member_records(group, changes)
        try:
            try:
                reply = await self._steady_batch(
                    keys=[keys.mutex, keys.metadata],
                    args=[token, ttl_ms, *_known(cached), WRITE_LOG_SIZE, write_id, *records],
                )
                if int(reply[0]) == 3:
                    self.metrics.store_writes.inc()
                    revision = int(reply[1])
                    if len(reply) == 2:
                        result = Loaded(keys, revision, write_id, cached.updated_at, group)
                        self._parsed[keys.metadata] = result
                        return CommitResult(True, revision, result)
                    # Written on top of member-only writes made since the copy
                    # (another process's heartbeats): take their records in.
                    self.metrics.steady_catch_ups.inc()
                    try:
                        caught_up = _apply_delta(group, reply[2:])
                    except _StaleCache:  # a record the log names is gone: read it all next time
                        self._parsed.pop(keys.metadata, None)
                        return CommitResult(True, revision, None)
                    result = Loaded(keys, revision, write_id, cached.updated_at, caught_up)
                    self._parsed[keys.metadata] = result
                    return CommitResult(True, revision, result)
                # The script compared with ``cached``: a delta applies to it.
                return self._loaded(keys, cached, reply)
            except _StaleCache:
                # As in ``load``: read everything; the mutex is ours already.
                self._parsed.pop(keys.metadata, None)
                return await self._load_once(keys, "", 0)
        except StoreError:
            await self.release(keys.mutex, token)
            self.metrics.schema_errors.inc()
            raise

    async def commit(
        self,
        loaded: Loaded | None,
        keys: GroupKeys,
        group: GroupMetadata,
        changes: Sequence[Change],
        token: str,
        *,
        restamp: bool = False,
    ) -> CommitResult:
        """Write ``changes`` (taken from ``group``) if Redis still holds ``loaded.revision``.

        ``loaded`` is None to create the group (only if the key is absent).  A
        write of member records only (a steady heartbeat) sends just those
        records; a create, a v1 group and a document change write the group
        document too.  Also releases the mutex ``token`` in the same round trip.

        A document write is refused (``server_changed``) when another Redis
        server incarnation stamped the group last, unless ``restamp`` says the
        write opens the correction round that such a change calls for.
        """
        whole = loaded is None or loaded.layout_version != LAYOUT_VERSION
        document = whole or not steady(changes)
        revision = 1 if loaded is None else loaded.revision + 1
        write_id = unique_id()
        # Stamped on document writes only: a steady heartbeat sends no more
        # than it must (its member record carries its own time).
        updated_at = _now_iso() if document or loaded is None else loaded.updated_at
        sets = ["revision", str(revision), "writeId", write_id]
        deletes: list[str] = []
        if document:
            sets += [
                "updatedAt",
                updated_at,
                "group",
                group.model_dump_json(by_alias=True, exclude={"members"}),
                "schemaVersion",
                str(SCHEMA_VERSION),
                "layoutVersion",
                str(LAYOUT_VERSION),
            ]
        if whole:
            for member_id, member in group.members.items():
                sets += [f"m:{member_id}", _member_json(member)]
            if loaded is not None:
                deletes.append("aggregate")  # the v1 layout's single field
            sets += _log_entry(revision, write_id, document=True, written=[])
        else:
            records, deletes = _member_fields(revision, write_id, group, changes, document=document)
            sets += records
        expected = "" if loaded is None else str(loaded.revision)
        stamp = ("restamp" if restamp else "check") if document else ""
        reply = await self._commit(
            keys=[keys.metadata, keys.mutex],
            args=[expected, token, stamp, *sets, "", *deletes],
        )
        if isinstance(reply, list) and int(reply[0]) == 2:
            self._parsed.pop(keys.metadata, None)
            return CommitResult(False, None, None, server_changed=True)
        if reply != 1:
            self.metrics.state_conflicts.inc()
            self._parsed.pop(keys.metadata, None)
            current = reply[1]
            return CommitResult(False, int(current) if current is not None else None, None)
        self.metrics.store_writes.inc()
        result = Loaded(keys, revision, write_id, updated_at, group)
        self._parsed[keys.metadata] = result
        return CommitResult(True, revision, result)

    async def delete(self, loaded: Loaded, token: str) -> bool:
        keys = loaded.keys
        deleted = bool(
            await self._delete(keys=[keys.metadata, keys.mutex], args=[loaded.revision, token])
        )
        if deleted:
            self._parsed.pop(keys.metadata, None)
            await self.client.srem(self.index_key, keys.index_member)
        return deleted

    def forget(self, keys: GroupKeys) -> None:
        """Drop what this process remembers of a group (it is being recreated)."""
        self._parsed.pop(keys.metadata, None)

    # -- mutexes -------------------------------------------------------------

    @staticmethod
    def new_token() -> str:
        return unique_id()

    async def try_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        return bool(await self.client.set(key, token, nx=True, px=ttl_ms))

    async def release(self, key: str, token: str) -> None:
        await self._release(keys=[key], args=[token])

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        """Extend a mutex we hold; False when it is no longer ours."""
        return bool(await self._renew(keys=[key], args=[token, ttl_ms]))

    # -- stream layout records -------------------------------------------------

    async def read_stream_record(self, stream_prefix: str) -> dict[str, str] | None:
        raw = await self.client.hgetall(self.stream_record_key(stream_prefix))
        if not raw:
            return None
        return {_s(k): _s(v) for k, v in raw.items()}

    async def create_stream_record(self, stream_prefix: str, fields: dict[str, str]) -> bool:
        args: list[str] = []
        for name, value in fields.items():
            args += [name, value]
        return bool(
            await self._create_hash(keys=[self.stream_record_key(stream_prefix)], args=args)
        )

    async def update_stream_record(
        self, stream_prefix: str, fields: dict[str, str], *, bump: bool = False
    ) -> None:
        """Overwrite some fields; ``bump`` the record's ``metadataVersion`` too."""
        key = self.stream_record_key(stream_prefix)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
            if bump:
                pipe.hincrby(key, "metadataVersion", 1)
            await pipe.execute()

    # -- group index -----------------------------------------------------------

    async def add_to_index(self, keys: GroupKeys) -> None:
        await self.client.sadd(self.index_key, keys.index_member)

    async def indexed_groups(self) -> list[tuple[str, str]]:
        members = await self.client.smembers(self.index_key)
        out = []
        for raw in members:
            prefix, sep, group = _s(raw).partition(INDEX_SEPARATOR)
            if sep:
                out.append((prefix, group))
        return sorted(out)

    async def rebuild_index(self) -> int:
        """Re-add every group whose metadata key exists (SCAN); returns how many were found."""
        pattern = f"{_glob_escape(self.key_prefix)}:{{*}}:metadata"
        head = len(self.key_prefix) + 2  # "<prefix>:{"
        found = 0
        async for raw in self.client.scan_iter(match=pattern, count=1000):
            inner = _s(raw)[head : -len("}:metadata")]
            # Group names never contain ':', so the last one separates the parts.
            prefix, sep, group = inner.rpartition(":")
            if sep and prefix and group:
                await self.client.sadd(self.index_key, f"{prefix}{INDEX_SEPARATOR}{group}")
                found += 1
        return found


def _parse_full(flat: Sequence[Any]) -> GroupMetadata:
    """A group from every field of its v2 hash (name, value, name, value, ...)."""
    document = None
    members: dict[str, MemberMetadata] = {}
    for i in range(0, len(flat) - 1, 2):
        name = _s(flat[i])
        if name.startswith("m:"):
            members[name[2:]] = MemberMetadata.model_validate_json(flat[i + 1])
        elif name == "group":
            document = flat[i + 1]
    if document is None:
        raise ValueError("no group document")
    group = GroupMetadata.model_validate_json(document)
    group.members = members
    return group


def _known(cached: Loaded | None) -> tuple[str, str]:
    """The (revision, writeId) a script compares with Redis's ('' when nothing is cached)."""
    return (str(cached.revision), cached.write_id) if cached is not None else ("", "")


def _log_entry(revision: int, write_id: str, *, document: bool, written: list[str]) -> list[str]:
    entry = [revision, write_id, 1 if document else 0, [] if document else written]
    return [f"log:{revision % WRITE_LOG_SIZE}", json.dumps(entry, separators=(",", ":"))]


def _member_records(group: GroupMetadata, changes: Sequence[Change]) -> list[str]:
    """``m:<memberId>`` / record pairs of the members ``changes`` upserted."""
    records: list[str] = []
    for change in changes:
        if isinstance(change, MemberUpserted):
            member_id = change.member.member_id
            records += [f"m:{member_id}", _member_json(group.members[member_id])]
    return records


def _member_fields(
    revision: int,
    write_id: str,
    group: GroupMetadata,
    changes: Sequence[Change],
    *,
    document: bool,
) -> tuple[list[str], list[str]]:
    """Fields to set (the changed member records, the log entry of ``revision``)
    and to delete (removed members) for ``changes``."""
    written = [c.member.member_id for c in changes if isinstance(c, MemberUpserted)]
    deletes = [f"m:{c.member_id}" for c in changes if isinstance(c, MemberRemoved)]
    sets = _member_records(group, changes)
    return sets + _log_entry(revision, write_id, document=document, written=written), deletes


def _member_json(member: MemberMetadata) -> str:
    # Every field, so fields added later are carried; defaults are left out
    # (parsing restores them), which halves a typical record.
    return member.model_dump_json(by_alias=True, exclude_defaults=True)


class _StaleCache(Exception):
    """A member record the write log names is gone: the parsed copy cannot be patched."""


def _apply_delta(group: GroupMetadata, flat: Sequence[Any]) -> GroupMetadata:
    """``group`` with the member records written since (id, record, id, record, ...)."""
    members = dict(group.members)
    for i in range(0, len(flat) - 1, 2):
        if flat[i + 1] is None:
            raise _StaleCache
        members[_s(flat[i])] = MemberMetadata.model_validate_json(flat[i + 1])
    return group.model_copy(update={"members": members})


def _opt(value: Any) -> str:
    return "missing" if value is None else _s(value)


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
