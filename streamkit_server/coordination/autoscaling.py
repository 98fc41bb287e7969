"""Shard figures read from Redis for the autoscaling signal and the detail gauges.

``read_sample`` asks ``XINFO GROUPS`` of every shard stream of a group (in
pipelined chunks: one round trip per chunk, not per shard).  ``LagHistory``
keeps each group's recent samples in this process, so the throughput over
the last couple of minutes comes from two of them.  ``LagSampler`` reads
every group every ``LAG_SAMPLE_INTERVAL_MS`` and feeds the history and the
``/metrics`` gauges; the autoscaling endpoint takes a fresh sample per call
as well, so its lag is never older than the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import InitVar, dataclass
from typing import Any

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from streamkit.routing import stream_key
from streamkit_server.coordination.executor import now_ms
from streamkit_server.coordination.service import CoordinatorService
from streamkit_server.core.autoscaling import GroupSample, ShardSample, throughput
from streamkit_server.core.model import GroupMetadata
from streamkit_server.observability.detail_gauges import DetailGauges
from streamkit_server.store.records import RedisClient, StoreError

__all__ = ["WINDOW_MS", "LagHistory", "LagSampler", "read_sample"]

log = logging.getLogger("streamkit_server.autoscaling")

#: Throughput is measured over (at most) this much history.
WINDOW_MS = 120_000
# XINFO GROUPS per pipeline: large enough that 10,000 shards take 20 round
# trips, small enough that one reply stays a few hundred kB.
_CHUNK = 500


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _refused(exc: ResponseError) -> bool:
    # XINFO denied by an ACL or renamed: not a missing stream (the same test as
    # the API's error mapping, which turns it into 503 REDIS_COMMAND_UNSUPPORTED).
    text = str(exc).lower()
    return isinstance(exc, NoPermissionError) or text.startswith(
        ("unknown command", "unknown subcommand", "err unknown command")
    )


def _shard(shard: int, reply: Any, group: str) -> ShardSample:
    if isinstance(reply, ResponseError):
        if _refused(reply):
            raise reply
        return ShardSample(shard, 0, 0, None)  # no stream (yet, or any more): nothing waits
    if isinstance(reply, Exception):
        raise reply
    for entry in reply or ():
        if _text(entry.get("name")) == group:
            return ShardSample(
                shard=shard,
                lag=_int(entry.get("lag")),
                pending=int(entry.get("pending") or 0),
                entries_read=_int(entry.get("entries-read")),
            )
    # The stream exists without this group (created on first read): its whole
    # length waits, which XLEN would tell; unknown here, so say so.
    return ShardSample(shard, None, 0, None)


async def read_sample(client: RedisClient, group: GroupMetadata, at_ms: int) -> GroupSample:
    """The group's figures on every shard it reads (layout and draining shards)."""
    shards = sorted(set(group.layout) | set(group.draining_shards))
    out: list[ShardSample] = []
    for start in range(0, len(shards), _CHUNK):
        chunk = shards[start : start + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for shard in chunk:
            pipe.xinfo_groups(stream_key(group.stream_prefix, shard))
        replies = await pipe.execute(raise_on_error=False)
        out.extend(_shard(s, r, group.consumer_group) for s, r in zip(chunk, replies, strict=True))
    return GroupSample(at_ms=at_ms, shards=tuple(out))


class LagHistory:
    """Recent samples per group, oldest first, trimmed to ``WINDOW_MS``."""

    def __init__(self, window_ms: int = WINDOW_MS, max_samples: int = 64) -> None:
        self.window_ms = window_ms
        self._max = max_samples
        self._samples: dict[tuple[str, str], deque[GroupSample]] = {}

    def add(self, key: tuple[str, str], sample: GroupSample) -> list[GroupSample]:
        """Record ``sample``; the samples of the window, ending with it."""
        kept = self._samples.setdefault(key, deque(maxlen=self._max))
        if kept and kept[-1].at_ms > sample.at_ms:
            kept.clear()  # the clock went back: start over rather than divide by <= 0
        kept.append(sample)
        while len(kept) > 1 and kept[0].at_ms < sample.at_ms - self.window_ms:
            kept.popleft()
        return list(kept)

    def forget_except(self, seen: set[tuple[str, str]]) -> None:
        for key in [k for k in self._samples if k not in seen]:
            del self._samples[key]


@dataclass(eq=False, repr=False)
class LagSampler:
    """Reads every group's shard figures every ``interval_ms`` (0: never)."""

    service: CoordinatorService
    client: RedisClient
    gauges: DetailGauges
    interval_ms: InitVar[int]

    def __post_init__(self, interval_ms: int) -> None:
        self.interval_s = interval_ms / 1000
        self.history = LagHistory()
        self._task: asyncio.Task[None] | None = None

    async def sample(self, group: GroupMetadata) -> list[GroupSample]:
        """A fresh sample of ``group``, recorded; the window's samples."""
        key = (group.stream_prefix, group.consumer_group)
        sample = await read_sample(self.client, group, now_ms())
        window = self.history.add(key, sample)
        rate = throughput(window).per_second
        self.gauges.observe_sample(*key, sample, rate)
        return window

    async def pass_once(self) -> None:
        seen: set[tuple[str, str]] = set()
        store = self.service.store
        for prefix, name in await store.indexed_groups():
            if self.service.gate.terminating:
                return
            seen.add((prefix, name))
            try:
                loaded = await store.load(self.service.keys(prefix, name))
                if loaded is not None:
                    await self.sample(loaded.group)
            except StoreError as exc:  # one unreadable group must not stop the others
                log.debug("not sampling %s/%s: %s", prefix, name, exc)
        self.history.forget_except(seen)

    async def run(self) -> None:
        while not self.service.gate.terminating:
            try:
                await self.pass_once()
            except (RedisError, OSError) as exc:  # the next pass retries
                log.warning("lag sampling failed: %s", exc)
            except Exception:  # a bug must not end the sampling for good
                log.exception("lag sampling failed")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.create_task(self.run(), name="streamkit-lag-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
