"""The built-in reader of one member: a fair ``XREADGROUP`` poller.

A :class:`ShardPoller` hosts one :class:`~streamkit.consumer.shard_reader.ShardReader`
per owned shard and gives them what they share: the member's in-flight budget
(``streamkit.consumer.fair_gate``), its lease, the handler
(``streamkit.consumer.invoke`` and ``streamkit.consumer.dispatch``) and the
records of what happened (halted shards, Redis reachability).  The member
runtime starts, halts, drains and aborts readers as the coordinator assigns
and revokes shards.  How the parts fit: docs/architecture.md, "Client".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, InitVar, dataclass

import anyio
from anyio.abc import TaskGroup, TaskStatus

from streamkit.connections import AsyncRedis, redis_address
from streamkit.consumer.dispatch import Dispatcher
from streamkit.consumer.fair_gate import FairGate
from streamkit.consumer.handlers import BatchHandler, Handler
from streamkit.consumer.idempotence import CommitCounts
from streamkit.consumer.invoke import Invoker
from streamkit.consumer.member import MemberStateMachine
from streamkit.consumer.options import PollerOptions, ReadObserver
from streamkit.consumer.reader_host import Reader
from streamkit.consumer.shard_io import ShardIO, supports_xackdel
from streamkit.consumer.shard_reader import ShardReader
from streamkit.middleware import Middleware
from streamkit.protocol import RuntimeConsumerCapacity, ShardConsumptionProgress
from streamkit.redis_health import RedisReachability
from streamkit.routing import stream_key

__all__ = [
    "BatchHandler",
    "FairGate",
    "Handler",
    "PollerOptions",
    "ReadObserver",
    "ShardPoller",
    "supports_xackdel",
]

log = logging.getLogger("streamkit.poller")


@dataclass(eq=False, repr=False)
class ShardPoller:
    """All read loops of one member, sharing its in-flight budget."""

    machine: MemberStateMachine
    redis: AsyncRedis
    _: KW_ONLY
    stream_prefix: str
    consumer_group: str
    handler: InitVar[Handler | None] = None
    batch_handler: InitVar[BatchHandler | None] = None
    options: PollerOptions
    xackdel: bool = False
    observer: ReadObserver | None = None
    middlewares: InitVar[Sequence[Middleware]] = ()

    def __post_init__(
        self,
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        middlewares: Sequence[Middleware],
    ) -> None:
        self.member_id = self.machine.member_id
        self.invoker = Invoker(
            stream_prefix=self.stream_prefix,
            consumer_group=self.consumer_group,
            member_id=self.member_id,
            options=self.options,
            handler=handler,
            batch_handler=batch_handler,
            middlewares=middlewares,
        )
        self.dispatcher = Dispatcher(self.invoker, self.options)
        self.gate = FairGate(self.options.max_in_flight)
        #: Outcomes of reads and acks: the member gives its shards back when
        #: Redis stays unreachable (see ``streamkit.redis_health``).
        self.reachability = RedisReachability()
        self.redis_address = redis_address(self.redis)
        self.dead_letter_key = self.options.policy.dead_letter_key(
            self.stream_prefix, self.consumer_group
        )
        #: shard -> the entry that halted it (``on_exhausted="halt"``).
        self.halted: dict[int, str] = {}
        #: Entries written to the dead-letter stream (metrics).
        self.dead_letter_count = 0
        #: Idempotent listeners: duplicates skipped, commits fenced (metrics).
        self.commit_counts = CommitCounts()
        self._readers: dict[int, ShardReader] = {}
        self._changed = anyio.Event()
        self._closed = anyio.Event()
        self._tg: TaskGroup | None = None

    @property
    def lease(self) -> MemberStateMachine:
        return self.machine

    # -- task ----------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the read loops; returns after ``close()`` (or cancellation)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await self._closed.wait()
            tg.cancel_scope.cancel()
        self._tg = None

    def close(self) -> None:
        """Stop hosting: cancels whatever still runs (handlers included)."""
        self._closed.set()

    # -- ownership -------------------------------------------------------------------

    def start(self, shards: frozenset[int]) -> None:
        if self._tg is None:
            raise RuntimeError("ShardPoller.start() before run()")
        for shard in sorted(shards):
            old = self._readers.get(shard)
            if old is not None and not old.stopping:
                continue  # already reading it
            reader = self._readers[shard] = ShardReader(self, self._io(shard), shard)
            self._tg.start_soon(reader.run, name=f"streamkit-read-{reader.stream_key}")

    def _io(self, shard: int) -> ShardIO:
        return ShardIO(
            self.redis,
            stream_key=stream_key(self.stream_prefix, shard),
            consumer_group=self.consumer_group,
            member_id=self.member_id,
            xackdel=self.xackdel,
            dead_letter_key=self.dead_letter_key,
            dead_letter_maxlen=self.options.policy.dead_letter_maxlen,
        )

    def halt(self, shards: frozenset[int]) -> None:
        """Stop new reads of ``shards`` now (in-flight handlers go on)."""
        for shard in shards:
            reader = self._readers.get(shard)
            if reader is not None:
                reader.halt()

    async def drain(self, shards: frozenset[int]) -> None:
        """Stop reading ``shards`` and wait until their work is done and acked."""
        readers = [r for r in (self._readers.get(shard) for shard in shards) if r is not None]
        for reader in readers:
            reader.halt()
        for reader in readers:
            await reader.finished.wait()

    def abort(self, shards: frozenset[int]) -> None:
        """Lost: stop reading and acking at once; do not wait for handlers."""
        for shard in shards:
            reader = self._readers.pop(shard, None)
            self.halted.pop(shard, None)
            if reader is not None:
                reader.abort()

    def abort_all(self) -> None:
        self.abort(frozenset(self._readers))

    # -- what readers ask (ReaderHost) -------------------------------------------------

    def reader_finished(self, reader: Reader) -> None:
        if self._readers.get(reader.shard) is reader:
            del self._readers[reader.shard]
            self.halted.pop(reader.shard, None)

    def shard_halted(self, shard: int, entry_id: str) -> None:
        self.halted[shard] = entry_id

    def dead_lettered(self) -> None:
        self.dead_letter_count += 1

    def idle_share(self) -> int:
        """Tokens an idle shard's blocking read asks for.

        More than one, so that a blocking read coming back short (fewer
        entries than asked) proves the stream drained and the next read can
        block again at once, with no empty non-blocking read in between.  At
        most half the member's budget is spread over its idle shards, so a
        busy shard always finds tokens.
        """
        share = self.gate.capacity // (2 * max(1, len(self._readers)))
        return max(1, min(self.options.batch_size, share))

    def notify(self) -> None:
        """The member's state changed (a heartbeat answered): re-check leases."""
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for_change(self) -> None:
        await self._changed.wait()

    # -- reports -----------------------------------------------------------------------

    def in_flight(self) -> dict[int, int]:
        return {shard: r.in_flight for shard, r in self._readers.items() if r.in_flight}

    def capacity(self) -> RuntimeConsumerCapacity:
        return RuntimeConsumerCapacity(
            runtime_max_concurrency=self.gate.capacity,
            available_concurrency=self.gate.available,
        )

    def progress(self) -> list[ShardConsumptionProgress]:
        return [self._readers[shard].progress() for shard in sorted(self._readers)]
