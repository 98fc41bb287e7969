"""Stream-wide state: the layout record and the stream lock.

The shard streams of a prefix are shared by all of its consumer groups, so
some decisions are per stream, not per group:

* ``StreamRecord`` (``{kp}:{<prefix>}:stream``) says which physical shards
  the stream routes to (``layout``), whether scales keep per-key order
  (``ordering``) and which consumer groups it has (``groups``), and is what a
  group created later starts from.  The group metadata stays the source of
  truth: when groups exist, their common layout wins and the record is
  re-synced from it.  A group's name is added before its metadata is written
  and removed after it is deleted, so ``groups`` never misses a group; stream
  operations read it (plus the group index) instead of SCANning every node.
* ``StreamLock`` serialises stream-wide changes (creation, scale, rollback,
  shard retirement) across coordinator processes.  It is a Redis mutex with a
  TTL that is renewed while held, so a slow provisioning does not lose it and
  a crashed holder frees it within one TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, TypeAlias

from redis.exceptions import RedisError

from streamkit_server.core import GroupMetadata
from streamkit_server.errors import CoordinatorError
from streamkit_server.store.metadata import MetadataStore

__all__ = [
    "Ordering",
    "StreamLock",
    "StreamRecord",
    "common_layout",
    "read_record",
    "stream_group_names",
]

log = logging.getLogger("streamkit_server.streams")

Ordering: TypeAlias = Literal["none", "key"]
ORDERINGS: Final[tuple[Ordering, ...]] = ("none", "key")


@dataclass(frozen=True, slots=True)
class StreamRecord:
    layout: tuple[int, ...]
    ordering: Ordering = "none"
    groups: tuple[str, ...] = ()

    @property
    def shard_count(self) -> int:
        return len(self.layout)

    @classmethod
    def parse(cls, raw: Mapping[str, str], stream_prefix: str) -> StreamRecord:
        """Read a record; records written before layouts existed are the identity."""
        try:
            count = int(raw["shardCount"])
            layout = json.loads(raw["layout"]) if "layout" in raw else list(range(count))
            ordering = raw.get("ordering") or "none"
            groups = json.loads(raw.get("groups") or "[]")
            valid = (
                isinstance(layout, list)
                and len(layout) == count
                and all(isinstance(s, int) and s >= 0 for s in layout)
                and ordering in ORDERINGS
                and isinstance(groups, list)
                and all(isinstance(g, str) for g in groups)
            )
        except (KeyError, ValueError):
            valid = False
        if not valid:
            raise CoordinatorError(
                "METADATA_CORRUPT",
                f"stream layout record of {stream_prefix!r} is unreadable "
                "(shardCount/layout/ordering/groups); repair it from the group metadata",
            )
        return cls(tuple(layout), "key" if ordering == "key" else "none", tuple(groups))

    def layout_fields(self) -> dict[str, str]:
        return {
            "shardCount": str(self.shard_count),
            "layout": json.dumps(list(self.layout)),
            "ordering": self.ordering,
        }

    def groups_field(self) -> dict[str, str]:
        return {"groups": json.dumps(sorted(set(self.groups)))}


async def read_record(store: MetadataStore, stream_prefix: str) -> StreamRecord | None:
    raw = await store.read_stream_record(stream_prefix)
    return None if raw is None else StreamRecord.parse(raw, stream_prefix)


async def stream_group_names(
    store: MetadataStore, stream_prefix: str, record: StreamRecord | None
) -> list[str]:
    """Every group the stream may have: the record's list plus the group index.

    Both are supersets in the usual case; the union also covers records
    written before they listed groups.  Names without metadata are skipped by
    whoever loads them.
    """
    names = set(record.groups) if record is not None else set()
    names.update(g for p, g in await store.indexed_groups() if p == stream_prefix)
    return sorted(names)


def common_layout(stream_prefix: str, groups: Iterable[GroupMetadata]) -> tuple[int, ...] | None:
    """The layout every group routes to (None without groups).

    All groups of a stream switch together, so differing layouts mean a
    stream-wide change was interrupted in a way the coordinator cannot repair
    on its own; refuse rather than guess which one producers use.
    """
    layouts = {tuple(g.layout) for g in groups}
    if len(layouts) > 1:
        raise CoordinatorError(
            "LAYOUT_DIVERGED",
            f"the consumer groups of stream {stream_prefix!r} route to different shard "
            f"layouts ({sorted(layouts)}); repair the group metadata before changing the stream",
        )
    return layouts.pop() if layouts else None


class StreamLock:
    """``async with StreamLock(...)``: wait for the lock (503 COORDINATOR_BUSY on timeout)."""

    def __init__(self, store: MetadataStore, stream_prefix: str, ttl_ms: int, wait_ms: int) -> None:
        self.store = store
        self.stream_prefix = stream_prefix
        self.key = store.stream_lock_key(stream_prefix)
        self.token = store.new_token()
        self.ttl_ms = ttl_ms
        self.wait_ms = wait_ms
        self.lost = False
        self._renewal: asyncio.Task[None] | None = None

    async def try_acquire(self) -> bool:
        """One attempt, for the tick loop: it comes back next pass instead of waiting."""
        if not await self.store.try_lock(self.key, self.token, self.ttl_ms):
            return False
        self._renewal = asyncio.create_task(self._renew(), name=f"stream-lock-{self.key}")
        return True

    async def __aenter__(self) -> StreamLock:
        deadline = time.monotonic() + self.wait_ms / 1000
        while not await self.try_acquire():
            if time.monotonic() > deadline:
                raise CoordinatorError(
                    "COORDINATOR_BUSY",
                    f"stream {self.stream_prefix!r} is being changed (scale, rollback or "
                    "shard retirement in progress); retry",
                )
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    async def release(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None
        with contextlib.suppress(RedisError, OSError):
            await self.store.release(self.key, self.token)

    def check(self) -> None:
        """Raise before an irreversible step if the lock expired under us."""
        if self.lost:
            raise CoordinatorError(
                "COORDINATOR_BUSY",
                f"lost the lock of stream {self.stream_prefix!r} (Redis too slow?); "
                "the tick loop finishes the change",
            )

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                if not await self.store.renew(self.key, self.token, self.ttl_ms):
                    self.lost = True
                    log.error("stream lock %s expired while held", self.key)
                    return
            except (RedisError, OSError) as exc:
                # Keep trying: the TTL still covers a couple more attempts.
                log.warning("renewing stream lock %s failed: %r", self.key, exc)
