"""The Redis metadata store (SPEC §3 "Redis layout").

Keys (``kp`` = key prefix, default ``redis-stream:coord``):

* ``{kp}:{<streamPrefix>:<consumerGroup>}:metadata`` -- hash (layout 2):
  ``group`` (the group document: GroupMetadata JSON without its members),
  ``m:<memberId>`` (one MemberMetadata JSON per member), ``revision``
  (storeRevision, bumped by every write), ``writeId`` (random id of that
  write), ``log:<revision % 64>`` (which member records each recent write
  touched, or that it wrote the document), ``schemaVersion``,
  ``layoutVersion``, ``updatedAt``, ``redisServer`` (the Redis server
  incarnation that wrote the document last: see ``scripts.COMMIT``).  The source of
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

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

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
from streamkit_server.observability.metrics import Metrics
from streamkit_server.store import keys as key_names
from streamkit_server.store import scripts
from streamkit_server.store.batch import ScriptBatcher
from streamkit_server.store.keys import INDEX_SEPARATOR, GroupKeys
from streamkit_server.store.records import (
    CommitResult,
    Loaded,
    MetadataCorrupt,
    MetadataUnsupported,
    MutexBusy,
    RedisClient,
    StoreError,
    unique_id,
)

__all__ = ["MetadataStore"]

log = logging.getLogger("streamkit_server.store")

#: Entries of the write log kept in each group hash (one per revision, in a
#: ring).  A process whose parsed copy is at most this many revisions old
#: catches up by reading only the member records written since.
WRITE_LOG_SIZE: Final = 64


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class MetadataStore:
    def __init__(self, client: RedisClient, key_prefix: str, metrics: Metrics) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.metrics = metrics
        self.index_key = key_names.index_key(key_prefix)
        # Registered once; redis-py sends EVALSHA and reloads on NOSCRIPT.
        self._load: AsyncScript = client.register_script(scripts.WRITES_SINCE + scripts.LOAD)
        self._steady: AsyncScript = client.register_script(
            scripts.WRITES_SINCE + scripts.STEADY_PRELUDE + scripts.LOAD
        )
        # Concurrent steady writes (of any groups) share a round trip.
        self._steady_batch = ScriptBatcher(client, self._steady, metrics.steady_pipeline_sizes)
        self._commit: AsyncScript = client.register_script(scripts.COMMIT)
        self._delete: AsyncScript = client.register_script(scripts.DELETE)
        self._release: AsyncScript = client.register_script(scripts.RELEASE)
        self._create_hash: AsyncScript = client.register_script(scripts.CREATE_HASH)
        self._renew: AsyncScript = client.register_script(scripts.RENEW)
        # Parse cache only: an entry is used when Redis still holds its
        # (revision, writeId), or brought up to date from the member records
        # written since (the write log proves nothing else changed).
        self._parsed: dict[str, Loaded] = {}

    # -- keys ----------------------------------------------------------------

    def group_keys(self, stream_prefix: str, consumer_group: str) -> GroupKeys:
        return key_names.group_keys(self.key_prefix, stream_prefix, consumer_group)

    def stream_record_key(self, stream_prefix: str) -> str:
        return key_names.stream_record_key(self.key_prefix, stream_prefix)

    def stream_lock_key(self, stream_prefix: str) -> str:
        return key_names.stream_lock_key(self.key_prefix, stream_prefix)

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
        """A ``scripts.LOAD`` reply as a group (``cached``: the copy the script was told of)."""
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
