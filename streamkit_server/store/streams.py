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
import logging
import time
from collections.abc import AsyncIterator

from redis.exceptions import RedisError

from streamkit.closing import AsyncClosing
from streamkit_server.core.streams import StreamRecord
from streamkit_server.errors import CoordinatorError
from streamkit_server.store.metadata import MetadataStore

# The record's rules live in core/streams.py: import them from there.
__all__ = ["StreamLock", "read_record", "stream_group_names"]

log = logging.getLogger("streamkit_server.streams")


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


class StreamLock(AsyncClosing):
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
        """One attempt; True when it took the lock."""
        if not await self.store.try_lock(self.key, self.token, self.ttl_ms):
            return False
        self._renewal = asyncio.create_task(self._renew(), name=f"stream-lock-{self.key}")
        return True

    @contextlib.asynccontextmanager
    async def attempt(self) -> AsyncIterator[bool]:
        """``async with lock.attempt() as held:`` one attempt, released on the way
        out when taken.  For the periodic passes (migrations, retention): a busy
        stream is skipped and comes back next pass instead of waiting."""
        if not await self.try_acquire():
            yield False
            return
        try:
            yield True
        finally:
            await self.aclose()

    async def start(self) -> None:
        """Wait for the lock, up to ``wait_ms``."""
        deadline = time.monotonic() + self.wait_ms / 1000
        while not await self.try_acquire():
            if time.monotonic() > deadline:
                raise CoordinatorError(
                    "COORDINATOR_BUSY",
                    f"stream {self.stream_prefix!r} is being changed (scale, rollback or "
                    "shard retirement in progress); retry",
                )
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        """Release the lock (and stop renewing it)."""
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
