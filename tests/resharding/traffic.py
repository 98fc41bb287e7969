"""Steady keyed traffic through a real ``Publisher`` and real ``StreamKit`` consumers.

Every message carries ``n`` (global publish number), ``key`` (partition key),
``seq`` (per-key sequence) and ``at`` (publish wall time), so the tests can
check loss, duplicates, per-key order and end-to-end latency afterwards.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from consumer.support import ReadInterval, in_process_settings

from streamkit import Message, StreamKit
from streamkit.publisher.publisher import Publisher, PublishResult
from streamkit.publisher.routing_cache import RoutingUnavailable
from streamkit.settings import StreamKitSettings
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

#: Client routing cache: refresh often, lease no longer than the server's
#: producer lease (support.PRODUCER_LEASE_MS), as the docs require.
ROUTING = {"routing_refresh_interval": 0.3, "routing_lease": 1.5}


def client_settings(
    coordinator: CoordinatorProcess, target: RedisTarget, base: str
) -> dict[str, Any]:
    return {**in_process_settings(coordinator, target, base), **ROUTING}


@dataclass
class Handled:
    n: int
    key: str
    seq: int
    stream_key: str
    member: str
    published_at: float
    handled_at: float


@dataclass
class Sink:
    """Everything the consumers handled, in handling order.

    Also the consumers' read observer: it learns each member's epoch from its
    reads, and records every handler call (start to finish, with the member
    and that epoch) for the processing-exclusivity check.
    """

    items: list[Handled] = field(default_factory=list)
    calls: list[ReadInterval] = field(default_factory=list)
    _epochs: dict[tuple[int, str], int] = field(default_factory=dict)

    def read_started(self, shard: int, member_id: str, epoch: int) -> None:
        self._epochs[(shard, member_id)] = epoch

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None:
        pass

    async def handle(self, msg: Message) -> None:
        started = time.monotonic_ns()
        try:
            await self._handle(msg)
        finally:
            epoch = self._epochs.get((msg.shard, msg.member_id), 0)
            self.calls.append(
                ReadInterval(msg.shard, msg.member_id, epoch, started, time.monotonic_ns())
            )

    async def _handle(self, msg: Message) -> None:
        f = msg.fields
        item = Handled(
            n=int(f["n"]),
            key=f["key"],
            seq=int(f["seq"]),
            stream_key=msg.stream_key,
            member=msg.member_id,
            published_at=float(f["at"]),
            handled_at=time.time(),
        )
        self.items.append(item)
        await msg.ack()

    def counts(self) -> Counter[int]:
        return Counter(item.n for item in self.items)

    def first_seen(self) -> dict[str, list[int]]:
        """Per key, the seq numbers in the order they were first handled."""
        seen: set[int] = set()
        order: dict[str, list[int]] = defaultdict(list)
        for item in self.items:
            if item.n not in seen:
                seen.add(item.n)
                order[item.key].append(item.seq)
        return order


@dataclass
class Traffic:
    """Publishes ``rate`` messages per second over ``keys`` keys until stopped."""

    publisher: Publisher
    rate: float = 200.0
    keys: int = 24
    published: dict[int, PublishResult] = field(default_factory=dict)
    #: Wall time each message was sent, by ``n``.
    sent_at: dict[int, float] = field(default_factory=dict)
    refused: list[RoutingUnavailable] = field(default_factory=list)
    stop: anyio.Event = field(default_factory=anyio.Event)

    async def run(self) -> None:
        seq: Counter[str] = Counter()
        n = 0
        started = time.monotonic()
        while not self.stop.is_set():
            key = f"k{n % self.keys}"
            at = time.time()
            fields = {"n": n, "key": key, "seq": seq[key], "at": repr(at)}
            try:
                self.published[n] = await self.publisher.publish(key, fields)
            except RoutingUnavailable as exc:
                self.refused.append(exc)  # fail closed: not published, not expected
            else:
                self.sent_at[n] = at
                seq[key] += 1
            n += 1
            # Steady rate: sleep until this message's slot, not a fixed gap.
            await anyio.sleep(max(0.0, started + n / self.rate - time.monotonic()))


def consumer(
    coordinator: CoordinatorProcess,
    target: RedisTarget,
    base: str,
    prefix: str,
    group: str,
    sink: Sink,
    concurrency: int = 1,
) -> StreamKit:
    app = StreamKit(**client_settings(coordinator, target, base), read_observer=sink)
    app.add_listener(prefix, group, sink.handle, concurrency=concurrency, batch_size=50)
    return app


@asynccontextmanager
async def serving(*apps: StreamKit) -> AsyncIterator[None]:
    """Run the apps in the background; shut them down gracefully on exit."""
    async with anyio.create_task_group() as tg:
        for app in apps:
            tg.start_soon(app.serve)
        try:
            yield
        finally:
            for app in apps:
                app.shutdown()


@asynccontextmanager
async def publishing(traffic: Traffic) -> AsyncIterator[Traffic]:
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        stack.push_async_callback(traffic.publisher.aclose)
        await traffic.publisher.start()
        tg.start_soon(traffic.run)
        try:
            yield traffic
        finally:
            traffic.stop.set()


def publisher(
    coordinator: CoordinatorProcess, target: RedisTarget, prefix: str, group: str
) -> Publisher:
    settings = StreamKitSettings(**client_settings(coordinator, target, "producer"))
    return Publisher(prefix, group, settings=settings)
