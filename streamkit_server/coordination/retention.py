"""Retention that respects the groups: the janitor and the retention setting.

A stream's retention (``core/retention.py``) is applied by a janitor task of
its own interval (``STREAMKIT_SERVER_RETENTION_INTERVAL_MS``) in every
coordinator process.  For one stream at a time it takes the stream lock with
a single attempt (``StreamLock.attempt``, as the tick loop does for
migrations), so only one process trims a given stream and no scale, rollback
or group create runs meanwhile; a busy stream is simply tried next pass.

Each shard is trimmed by one Lua script (``store/scripts.py`` ``RETAIN``):
the check of every group on the shard (``XINFO GROUPS`` last-delivered-id,
``XPENDING`` oldest pending id) and the ``XTRIM MINID`` are one atomic step,
so a group that reads, claims or is created in between cannot lose entries.
Retention never trims past the oldest entry a group still needs: a slow or
stopped group makes it wait (``redis_stream_coord_retention_blocked_seconds``
and a log line say which group, on which shard, for how long).

Dead-letter streams (``{prefix}:dlq:{group}``) are never trimmed by retention:
every entry there waits for an operator, who replays or deletes it.  They are
bounded by the consumers' ``dead_letter_maxlen`` (``XADD MAXLEN ~``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from streamkit.routing import stream_key
from streamkit_server.coordination.executor import now_ms
from streamkit_server.coordination.passes import guarded_pass
from streamkit_server.coordination.service import CoordinatorService
from streamkit_server.core.retention import (
    RetentionPolicy,
    StreamId,
    format_duration,
    parse_id,
)
from streamkit_server.core.streams import StreamRecord
from streamkit_server.errors import CoordinatorError, Rejected
from streamkit_server.store import scripts
from streamkit_server.store.records import RedisClient, StoreError
from streamkit_server.store.streams import read_record, stream_group_names

__all__ = [
    "RetentionJanitor",
    "RetentionView",
    "ShardTrim",
    "Trimmer",
    "read_retention",
    "set_retention",
]

log = logging.getLogger("streamkit_server.retention")

#: The most entries the length rule reads per script call (Redis runs a
#: script alone, so each call stays short); a longer excess takes more calls.
SCAN_LIMIT: Final = 1_000
#: Calls per shard per pass; what is left waits for the next pass.
_CALLS_PER_SHARD: Final = 8
#: A blocked shard is logged when it starts waiting, then at most this often.
_LOG_EVERY_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class ShardTrim:
    """One script call on one shard: what it trimmed and what held it back."""

    shard: int
    trimmed: int
    now_ms: int
    length_cut: StreamId | None
    floor: StreamId | None
    holder: str | None
    more: bool
    #: The policy wanted more than the groups allow (``holder`` holds it back).
    blocked: bool

    @property
    def waiting_ms(self) -> int:
        """When blocked: the age of the oldest entry the holding group still needs."""
        if not self.blocked or self.floor is None:
            return 0
        return max(0, self.now_ms - self.floor[0])


class Trimmer:
    """Runs ``RETAIN`` on one shard stream (one key per call: valid in Redis Cluster)."""

    def __init__(self, client: RedisClient, scan_limit: int = SCAN_LIMIT) -> None:
        self._script: AsyncScript = client.register_script(scripts.RETAIN)
        self.scan_limit = scan_limit

    async def trim(
        self, stream_prefix: str, shard: int, policy: RetentionPolicy, groups: Sequence[str]
    ) -> ShardTrim:
        args = [
            "" if policy.max_age_ms is None else policy.max_age_ms,
            "" if policy.max_length is None else policy.max_length,
            self.scan_limit,
            *groups,
        ]
        reply = await self._script(keys=[stream_key(stream_prefix, shard)], args=args)
        trimmed, now, cut, floor, holder, more, blocked = (_text(v) for v in reply)
        return ShardTrim(
            shard,
            int(trimmed),
            int(now),
            parse_id(cut) if cut else None,
            parse_id(floor) if floor else None,
            holder or None,
            more == "1",
            blocked == "1",
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Blocked:
    """Per group of one stream, over its shards: the worst wait and how many shards wait."""

    seconds: float = 0.0
    shards: list[int] = field(default_factory=list)


class RetentionJanitor:
    def __init__(self, service: CoordinatorService, trimmer: Trimmer, interval_ms: int) -> None:
        self.service = service
        self.trimmer = trimmer
        self.interval_s = interval_ms / 1000
        self.last_error: str | None = None
        #: (stream, group) series this process exports.
        self._exported: set[tuple[str, str]] = set()
        #: (stream, shard, group) -> since when this process sees it blocked
        #: (monotonic), and when it was last logged.
        self._since: dict[tuple[str, int, str], float] = {}
        self._logged: dict[tuple[str, int, str], float] = {}

    async def run(self) -> None:
        gate = self.service.gate
        while not gate.terminating:
            # A bug must not stop retention for good: logged, tried again.
            self.last_error = await guarded_pass(log, "retention", self.pass_once)
            await anyio.sleep(self.interval_s)

    async def pass_once(self) -> dict[str, list[ShardTrim]]:
        """One pass over every stream with retention; what each shard call did."""
        service = self.service
        default = service.settings.default_retention()
        done: dict[str, list[ShardTrim]] = {}
        exported: set[tuple[str, str]] = set()
        for prefix in sorted({p for p, _ in await service.store.indexed_groups()}):
            if service.gate.terminating or service.gate.suspended is not None:
                break
            try:
                record = await read_record(service.store, prefix)
                own = record.retention if record is not None else None
                policy = own if own is not None else default
                if policy is None or not policy.enabled:
                    continue
                trims = await self._stream(prefix, record, policy)
            except (Rejected, CoordinatorError, StoreError, ResponseError) as exc:
                # One stream's trouble (a corrupt record, a shard key of the
                # wrong type) must not stop retention of the others.
                log.error("retention of stream %s is stuck: %s", prefix, exc)
                continue
            if trims is None:
                continue  # busy: another process (or a stream change) has the lock
            done[prefix] = trims
            exported |= self._export(prefix, policy, trims)
        self._forget(exported)
        return done

    async def _stream(
        self, prefix: str, record: StreamRecord | None, policy: RetentionPolicy
    ) -> list[ShardTrim] | None:
        service = self.service
        lock = service.stream_lock(prefix)
        async with lock.attempt() as held:
            if not held:
                return None
            names = await stream_group_names(service.store, prefix, record)
            groups = await service.load_groups(prefix, names)
            shards: set[int] = set()
            for group in groups.values():
                shards |= group.known_shards()
            trims: list[ShardTrim] = []
            for shard in sorted(shards):
                for _ in range(_CALLS_PER_SHARD):
                    lock.check()  # never trim once another process may hold the stream
                    trim = await self.trimmer.trim(prefix, shard, policy, sorted(groups))
                    trims.append(trim)
                    if not trim.more:
                        break
            return trims

    def _export(
        self, prefix: str, policy: RetentionPolicy, trims: list[ShardTrim]
    ) -> set[tuple[str, str]]:
        metrics = self.service.metrics
        blocked: dict[str, _Blocked] = {}
        trimmed = 0
        for trim in trims:
            trimmed += trim.trimmed
            if trim.holder is not None:
                blocked.setdefault(trim.holder, _Blocked())
            if not trim.blocked or trim.holder is None:
                continue
            entry = blocked[trim.holder]
            entry.seconds = max(entry.seconds, trim.waiting_ms / 1000)
            if trim.shard not in entry.shards:
                entry.shards.append(trim.shard)
            self._log_blocked(prefix, trim, policy)
        if trimmed:
            metrics.retention_trimmed.labels(prefix).inc(trimmed)
        for group, entry in blocked.items():
            metrics.retention_blocked_seconds.labels(prefix, group).set(entry.seconds)
            metrics.retention_blocked_shards.labels(prefix, group).set(len(entry.shards))
        # A shard that waits no more starts its "for" afresh when it waits again.
        waiting = {(prefix, s, g) for g, entry in blocked.items() for s in entry.shards}
        for key in [k for k in self._since if k[0] == prefix and k not in waiting]:
            del self._since[key]
            self._logged.pop(key, None)
        return {(prefix, group) for group in blocked}

    def _log_blocked(self, prefix: str, trim: ShardTrim, policy: RetentionPolicy) -> None:
        group = trim.holder or "?"
        key = (prefix, trim.shard, group)
        now = time.monotonic()
        since = self._since.setdefault(key, now)
        if now - self._logged.get(key, -_LOG_EVERY_S) < _LOG_EVERY_S:
            return
        self._logged[key] = now
        log.warning(
            "retention blocked by group %s on shard %d of stream %s for %s "
            "(policy %s; it still needs entry %d-%d, written %s ago; nothing it needs "
            "is trimmed)",
            group,
            trim.shard,
            prefix,
            format_duration(int((now - since) * 1000)) if now > since else "0s",
            policy.describe(),
            *(trim.floor or (0, 0)),
            format_duration(trim.waiting_ms) if trim.waiting_ms else "0s",
        )

    def _forget(self, exported: set[tuple[str, str]]) -> None:
        # Series of streams this process did not trim this pass (no policy any
        # more, another process held the lock, a deleted group) are dropped,
        # so a stale value never outlives the process that measured it.
        metrics = self.service.metrics
        for labels in self._exported - exported:
            for gauge in (metrics.retention_blocked_seconds, metrics.retention_blocked_shards):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        self._exported = exported


async def set_retention(
    service: CoordinatorService,
    stream_prefix: str,
    policy: RetentionPolicy,
    requested_by: str,
    reason: str | None,
) -> RetentionView:
    """Store ``policy`` as the stream's retention (an empty one: none, over the default)."""
    async with service.gate.critical(), service.stream_lock(stream_prefix):
        record = await read_record(service.store, stream_prefix)
        if record is None:
            raise CoordinatorError("STREAM_NOT_FOUND", f"stream {stream_prefix!r} does not exist")
        await service.store.update_stream_record(
            stream_prefix,
            {
                "retention": policy.to_field(),
                "updatedAt": str(now_ms()),
                "requestedBy": requested_by,
                "reason": reason or "",
            },
            bump=True,
        )
    return RetentionView(policy, service.settings.default_retention())


@dataclass(frozen=True, slots=True)
class RetentionView:
    """A stream's retention: its own, the coordinator's default, and which one applies."""

    own: RetentionPolicy | None
    default: RetentionPolicy | None

    @property
    def effective(self) -> RetentionPolicy | None:
        policy = self.own if self.own is not None else self.default
        return policy if policy is not None and policy.enabled else None

    @property
    def source(self) -> str:
        if self.own is not None:
            return "stream"
        return "default" if self.default is not None else "none"

    def to_wire(self, stream_prefix: str) -> dict[str, object]:
        return {
            "streamPrefix": stream_prefix,
            "retention": None if self.own is None else self.own.to_wire(),
            "effective": None if self.effective is None else self.effective.to_wire(),
            "source": self.source,
        }


async def read_retention(service: CoordinatorService, stream_prefix: str) -> RetentionView:
    record = await read_record(service.store, stream_prefix)
    if record is None:
        raise CoordinatorError("STREAM_NOT_FOUND", f"stream {stream_prefix!r} does not exist")
    return RetentionView(record.retention, service.settings.default_retention())
