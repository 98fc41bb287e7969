"""The Redis metadata store (SPEC §3 "Redis layout").

Keys (``kp`` = key prefix, default ``redis-stream:coord``):

* ``{kp}:{<streamPrefix>:<consumerGroup>}:metadata`` -- hash: ``aggregate``
  (GroupMetadata JSON), ``revision`` (storeRevision), ``schemaVersion``,
  ``layoutVersion``, ``updatedAt``.  The source of truth.  No TTL, ever.
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
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

import redis.asyncio
from redis.commands.core import AsyncScript

from streamkit_server.core import LAYOUT_VERSION, SCHEMA_VERSION, GroupMetadata
from streamkit_server.metrics import Metrics

__all__ = [
    "INDEX_SEPARATOR",
    "CommitResult",
    "GroupKeys",
    "Loaded",
    "MetadataCorrupt",
    "MetadataStore",
    "MetadataUnsupported",
    "RedisClient",
    "StoreError",
]

log = logging.getLogger("streamkit_server.store")

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster

INDEX_SEPARATOR: Final = "\x00"

# KEYS: mutex, metadata.  ARGV: token ('' = read without locking), ttl ms, and
# the (revision, updatedAt, aggregate length) of the copy the caller has parsed
# already: when they still match, the aggregate is not sent again.
_LOAD = """
if ARGV[1] ~= '' then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
local m = redis.call('HMGET', KEYS[2], 'revision', 'schemaVersion', 'layoutVersion', 'updatedAt')
if not m[1] then
  if ARGV[1] ~= '' then redis.call('DEL', KEYS[1]) end
  return {2, redis.call('EXISTS', KEYS[2])}
end
local len = redis.call('HSTRLEN', KEYS[2], 'aggregate')
if m[1] == ARGV[3] and m[4] == ARGV[4] and tostring(len) == ARGV[5] then
  return {1, m[1], m[2], m[3], m[4], len}
end
return {1, m[1], m[2], m[3], m[4], len, redis.call('HGET', KEYS[2], 'aggregate')}
"""

# KEYS: metadata, mutex.  ARGV: expected revision ('' = create, only if the key
# is absent), aggregate, schemaVersion, layoutVersion, updatedAt, mutex token.
# The mutex is released in the same round trip whether or not the CAS passed.
_COMMIT = """
local cur = redis.call('HGET', KEYS[1], 'revision')
local ok
if ARGV[1] == '' then ok = redis.call('EXISTS', KEYS[1]) == 0 else ok = cur == ARGV[1] end
local new = ''
if ok then
  if ARGV[1] == '' then new = '1' else new = string.format('%d', tonumber(ARGV[1]) + 1) end
  redis.call('HSET', KEYS[1], 'aggregate', ARGV[2], 'revision', new,
    'schemaVersion', ARGV[3], 'layoutVersion', ARGV[4], 'updatedAt', ARGV[5])
end
if ARGV[6] ~= '' and redis.call('GET', KEYS[2]) == ARGV[6] then redis.call('DEL', KEYS[2]) end
if ok then return {1, new} end
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
    updated_at: str
    aggregate_len: int
    group: GroupMetadata
    #: Set when this process had seen a later revision of the group: Redis lost
    #: writes.  Holds the highest metadataVersion this process saw.
    regressed_from_version: int | None = None


@dataclass(frozen=True, slots=True)
class CommitResult:
    ok: bool
    revision: int | None
    loaded: Loaded | None


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class MetadataStore:
    def __init__(self, client: RedisClient, key_prefix: str, metrics: Metrics) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.metrics = metrics
        self.index_key = f"{key_prefix}:groups"
        # Registered once; redis-py sends EVALSHA and reloads on NOSCRIPT.
        self._load: AsyncScript = client.register_script(_LOAD)
        self._commit: AsyncScript = client.register_script(_COMMIT)
        self._delete: AsyncScript = client.register_script(_DELETE)
        self._release: AsyncScript = client.register_script(_RELEASE)
        self._create_hash: AsyncScript = client.register_script(_CREATE_HASH)
        self._renew: AsyncScript = client.register_script(_RENEW)
        # Parse cache only: the revision is always read from Redis first and an
        # entry is used only when (revision, updatedAt, aggregate length) all
        # still match what Redis holds.
        self._parsed: dict[str, Loaded] = {}
        # Highest revision seen per group lifecycle (created_at_ms, revision).
        self._highest: dict[str, tuple[int, int, int]] = {}

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

    async def load(self, keys: GroupKeys, token: str = "", ttl_ms: int = 0) -> Loaded | bool | None:
        """Read a group; with ``token`` also take its mutex in the same round trip.

        Returns the group, ``None`` when the metadata key does not exist, or
        ``False`` when ``token`` was given and the mutex is held by someone else.
        Raises ``StoreError`` when the metadata cannot be trusted.
        """
        cached = self._parsed.get(keys.metadata)
        known = (
            (str(cached.revision), cached.updated_at, str(cached.aggregate_len))
            if cached is not None
            else ("", "", "")
        )
        reply = await self._load(keys=[keys.mutex, keys.metadata], args=[token, ttl_ms, *known])
        status = int(reply[0])
        if status == 0:
            return False
        if status == 2:
            self._parsed.pop(keys.metadata, None)
            if int(reply[1]):
                self.metrics.schema_errors.inc()
                raise MetadataCorrupt(f"metadata hash {keys.metadata} has no revision field")
            return None
        revision_raw, schema, layout, updated_raw, length = reply[1:6]
        if (
            schema is None
            or layout is None
            or _s(schema) != str(SCHEMA_VERSION)
            or (_s(layout) != str(LAYOUT_VERSION))
        ):
            if token:
                await self.release(keys.mutex, token)
            self.metrics.schema_errors.inc()
            raise MetadataUnsupported(
                f"group metadata {keys.metadata} has schemaVersion={_opt(schema)} "
                f"layoutVersion={_opt(layout)}; this coordinator understands only "
                f"schemaVersion={SCHEMA_VERSION} layoutVersion={LAYOUT_VERSION}"
            )
        try:
            revision = int(revision_raw)
        except ValueError as exc:
            if token:
                await self.release(keys.mutex, token)
            self.metrics.schema_errors.inc()
            raise MetadataCorrupt(f"metadata {keys.metadata} has a non-numeric revision") from exc
        updated_at = _s(updated_raw) if updated_raw is not None else ""
        if len(reply) > 6:
            try:
                group = GroupMetadata.model_validate_json(reply[6])
            except ValueError as exc:
                if token:
                    await self.release(keys.mutex, token)
                self.metrics.schema_errors.inc()
                raise MetadataCorrupt(
                    f"metadata {keys.metadata} holds an aggregate that does not parse"
                ) from exc
            loaded = Loaded(keys, revision, updated_at, int(length), group)
            self._parsed[keys.metadata] = loaded
        else:
            assert cached is not None
            loaded = cached
        return self._observe(loaded, locked=bool(token))

    def _observe(self, loaded: Loaded, *, locked: bool) -> Loaded:
        key = loaded.keys.metadata
        lifecycle = loaded.group.created_at_ms
        version = loaded.group.metadata_version
        seen = self._highest.get(key)
        if seen is not None and seen[0] == lifecycle and loaded.revision < seen[1]:
            # Reported once, to a caller holding the mutex: it opens a
            # correction round and writes it, and from then on the new, lower
            # revision line is the one to follow.  A read-only load (tick scan,
            # monitoring) must not consume the report, or no round would open.
            if not locked:
                return loaded
            self.metrics.metadata_regression.inc()
            log.warning(
                "metadata revision regression for %s: this process saw revision %d, "
                "Redis now holds %d (lost writes, failover or restore); "
                "opening a metadata correction round",
                key,
                seen[1],
                loaded.revision,
            )
            self._highest[key] = (lifecycle, loaded.revision, version)
            return dataclasses.replace(loaded, regressed_from_version=max(seen[2], version))
        if seen is None or seen[0] != lifecycle or loaded.revision > seen[1]:
            self._highest[key] = (lifecycle, loaded.revision, version)
        return loaded

    async def commit(
        self, loaded: Loaded | None, keys: GroupKeys, group: GroupMetadata, token: str
    ) -> CommitResult:
        """Write ``group`` if Redis still holds ``loaded.revision`` (or nothing, to create).

        Also releases the mutex ``token`` in the same round trip.
        """
        aggregate = group.model_dump_json(by_alias=True)
        updated_at = _now_iso()
        expected = "" if loaded is None else str(loaded.revision)
        reply = await self._commit(
            keys=[keys.metadata, keys.mutex],
            args=[expected, aggregate, SCHEMA_VERSION, LAYOUT_VERSION, updated_at, token],
        )
        if not int(reply[0]):
            self.metrics.state_conflicts.inc()
            current = reply[1]
            return CommitResult(False, int(current) if current is not None else None, None)
        self.metrics.store_writes.inc()
        revision = int(reply[1])
        written = Loaded(keys, revision, updated_at, len(aggregate.encode()), group)
        self._parsed[keys.metadata] = written
        self._observe(written, locked=True)
        return CommitResult(True, revision, written)

    async def delete(self, loaded: Loaded, token: str) -> bool:
        keys = loaded.keys
        deleted = bool(
            await self._delete(keys=[keys.metadata, keys.mutex], args=[loaded.revision, token])
        )
        if deleted:
            self._parsed.pop(keys.metadata, None)
            self._highest.pop(keys.metadata, None)
            await self.client.srem(self.index_key, keys.index_member)
        return deleted

    def forget(self, keys: GroupKeys) -> None:
        """Drop what this process remembers of a group (it is being recreated)."""
        self._parsed.pop(keys.metadata, None)
        self._highest.pop(keys.metadata, None)

    # -- mutexes -------------------------------------------------------------

    @staticmethod
    def new_token() -> str:
        return secrets.token_hex(16)

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


def _opt(value: Any) -> str:
    return "missing" if value is None else _s(value)


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
