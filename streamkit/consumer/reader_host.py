"""What a :class:`~streamkit.consumer.shard_reader.ShardReader` may ask of
its member: the narrow interface the poller implements (the in-flight
budget, the lease, the dispatcher, where to report), so a reader never sees
the whole poller."""

from __future__ import annotations

from typing import Protocol

from streamkit.consumer.dispatch import Dispatcher
from streamkit.consumer.fair_gate import FairGate
from streamkit.consumer.idempotence import CommitCounts
from streamkit.consumer.options import PollerOptions, ReadObserver
from streamkit.redis_health import RedisReachability

__all__ = ["Lease", "Reader", "ReaderHost"]


class Reader(Protocol):
    """What the host knows of a reader that finished: its shard (and itself)."""

    @property
    def shard(self) -> int: ...


class Lease(Protocol):
    """The member state machine's answers a reader needs."""

    @property
    def epoch(self) -> int: ...

    def may_read(self, shard: int, now_ms: int) -> bool: ...

    def lease_remaining_ms(self, now_ms: int) -> int: ...


class ReaderHost(Protocol):
    """What a shard reader may ask of the member's poller."""

    options: PollerOptions
    gate: FairGate
    reachability: RedisReachability
    observer: ReadObserver | None
    dispatcher: Dispatcher
    redis_address: str
    commit_counts: CommitCounts

    @property
    def lease(self) -> Lease: ...

    def idle_share(self) -> int:
        """Tokens an idle shard's blocking read asks for."""

    async def wait_for_change(self) -> None:
        """Until the member's state changes (a heartbeat answered)."""

    def shard_halted(self, shard: int, entry_id: str) -> None: ...

    def dead_lettered(self) -> None: ...

    def reader_finished(self, reader: Reader) -> None: ...
