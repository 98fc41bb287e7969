"""Producer test helpers: a controllable clock, group setup and routing edits.

Everything runs against real redis-server processes and real coordinator
subprocesses. ``test_resharding`` changes routing through the coordinator's
scale endpoint. Where a test needs a change no endpoint makes (a metadata
rollback: Redis losing writes), or one exact version step with nothing else
moving, it edits the group's metadata hash in Redis as the coordinator would
have committed it; the coordinator then serves the edited metadata over HTTP.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import helpers
import pytest
from helpers import create_group, metadata_key

from streamkit.publisher.publisher import Publisher
from streamkit.settings import StreamKitSettings
from streamkit.testing import AsyncRedisClient, RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess

API = "/coord/v1"
#: Refresh interval and lease used with the fake clock; the retry interval
#: (and the "lease about to end" margin) is then min(5, (30 - 5) / 3) = 5.
REFRESH = 5.0
LEASE = 30.0


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll until ``predicate()`` holds (background refreshes have no event to wait on).

    Polls every 5 ms: some tests watch a counter pass through a value.
    """
    await helpers.eventually(predicate, within, "the predicate", interval=0.005)


@dataclass
class Stack:
    """One test's Redis, coordinator, names and clock."""

    target: RedisTarget
    coordinator: CoordinatorProcess
    redis: AsyncRedisClient
    clock: FakeClock = field(default_factory=FakeClock)
    prefix: str = field(default_factory=lambda: f"orders-{uuid.uuid4().hex[:8]}")
    group: str = "billing"
    _publishers: list[Publisher] = field(default_factory=list)

    def settings(self, **overrides: Any) -> StreamKitSettings:
        user, password = self.coordinator.admin_auth
        values: dict[str, Any] = {
            "coordinator_url": self.coordinator.url,
            "coordinator_username": user,
            "coordinator_password": password,
            "coordinator_timeout": 2.0,
            "redis_url": self.target.url,
            "redis_cluster": self.target.cluster,
            "routing_refresh_interval": REFRESH,
            "routing_lease": LEASE,
        }
        values.update(overrides)
        return StreamKitSettings(**values)

    def publisher(
        self, *, group: str | None = None, fake_clock: bool = True, **kwargs: Any
    ) -> Publisher:
        """A publisher closed at teardown; clients come from settings unless given."""
        kwargs.setdefault("settings", self.settings())
        if fake_clock:
            kwargs.setdefault("clock", self.clock)
        pub = Publisher(self.prefix, group or self.group, **kwargs)
        self._publishers.append(pub)
        return pub

    async def started_publisher(self, shards: int, **kwargs: Any) -> Publisher:
        """``create_group(shards)``, then a started ``publisher(**kwargs)``."""
        await self.create_group(shards)
        pub = self.publisher(**kwargs)
        await pub.start()
        return pub

    def key(self, shard: int) -> str:
        return f"{self.prefix}:{shard}"

    async def create_group(self, shards: int, group: str | None = None) -> None:
        await create_group(self.coordinator, self.prefix, group or self.group, shards)

    async def rewrite_routing(
        self, *, shard_count: int | None = None, version: int | None = None
    ) -> int:
        """Commit a routing change as the coordinator would; returns the new version.

        Bumps ``metadataVersion`` (or sets ``version``) and the store revision,
        optionally changes the shard count, and provisions shard streams that
        do not exist yet (new shards are provisioned before they are routed).
        """
        key = metadata_key(self.prefix, self.group)
        raw = await self.redis.hgetall(key)
        aggregate = json.loads(raw[b"group"])  # the v2 group document
        aggregate["metadataVersion"] = (
            version if version is not None else aggregate["metadataVersion"] + 1
        )
        if shard_count is not None:
            aggregate["shardCount"] = shard_count
            if "layout" in aggregate:  # routing index -> physical shard: identity here
                aggregate["layout"] = list(range(shard_count))
        aggregate["updatedAtMs"] = int(time.time() * 1000)
        await self.redis.hset(
            key,
            mapping={
                "group": json.dumps(aggregate, separators=(",", ":")),
                "revision": int(raw[b"revision"]) + 1,
                "writeId": "tests",
                "updatedAt": datetime.now(UTC).isoformat(),
            },
        )
        for shard in range(aggregate["shardCount"]):
            if not await self.redis.exists(self.key(shard)):
                await self.redis.xgroup_create(self.key(shard), self.group, id="0", mkstream=True)
        return int(aggregate["metadataVersion"])

    async def metadata_snapshot(self) -> dict[bytes, bytes]:
        return dict(await self.redis.hgetall(metadata_key(self.prefix, self.group)))

    async def restore_metadata(self, snapshot: dict[bytes, bytes]) -> None:
        """Put an older metadata hash back (what a failover losing writes does)."""
        key = metadata_key(self.prefix, self.group)
        await self.redis.delete(key)
        await self.redis.hset(key, mapping=snapshot)  # type: ignore[arg-type]

    async def close(self) -> None:
        for pub in self._publishers:
            await pub.aclose()
        await self.redis.aclose()


async def _stack(target: RedisTarget, coordinator: CoordinatorProcess) -> AsyncIterator[Stack]:
    stack = Stack(target, coordinator, redis_client(target))
    try:
        yield stack
    finally:
        await stack.close()


@pytest.fixture
async def stack(any_redis: RedisTarget, coordinator: CoordinatorProcess) -> AsyncIterator[Stack]:
    """Standalone and cluster, with the module's shared coordinator."""
    async for s in _stack(any_redis, coordinator):
        yield s


@pytest.fixture
async def private_stack(
    redis_url: str, coordinator_factory: Callable[..., CoordinatorProcess]
) -> AsyncIterator[Stack]:
    """Standalone Redis with a coordinator this test may stop, freeze and restart."""
    target = RedisTarget(redis_url, cluster=False)
    async for s in _stack(target, coordinator_factory(target)):
        yield s


async def gather(*calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run calls concurrently; return each result or the exception it raised."""
    results: list[Any] = [None] * len(calls)

    async def run(i: int, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            results[i] = await call()
        except Exception as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(run, i, call)
    return results
