"""Shard lifecycle hooks and the context they receive.

A coordinator member hands shards to its *reader* through three hooks.  The
built-in poller is one reader; an application can bring its own by passing a
``ShardLifecycle`` to ``app.shard_listener`` and reading Redis itself, as long
as it checks ``ctx.may_read(shard)`` before every read.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from streamkit.connections import AsyncRedis
from streamkit.consumer.member import MemberStateMachine
from streamkit.forwarding import Forward
from streamkit.routing import stream_key

__all__ = ["ShardContext", "ShardLifecycle", "monotonic_ms"]


def monotonic_ms() -> int:
    """The clock every lease decision uses: monotonic, in whole milliseconds.

    Never wall-clock time: an NTP step must not stretch or shrink a lease.
    """
    return time.monotonic_ns() // 1_000_000


@runtime_checkable
class ShardLifecycle(Protocol):
    """Hooks a member calls as its shard ownership changes.

    Each call gets the shards the change is about and the member's context.
    Calls for one shard never overlap: a shard's ``on_revoked`` starts only
    after its ``on_assigned`` returned, and so on.
    """

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        """The coordinator granted ``shards`` (status OK): reading may start.

        Entries the previous owner left pending are still in the group's PEL;
        a custom reader should claim them (``XAUTOCLAIM``) before reading ``>``.
        """

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        """``shards`` were taken away: ``ctx.may_read`` already says no.

        Return once every in-flight message of these shards is finished and
        acknowledged; the member reports them ``REVOKED`` after that, and only
        then may another member read them.  A drain that takes longer than the
        coordinator's rebalance timeout gets the member fenced (``on_lost``).
        """

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        """The member was fenced or forgotten: stop touching ``shards`` at once.

        Another member may already own them, so do not read or acknowledge
        their entries any more.  The member rejoins by itself afterwards.
        """


class ShardContext:
    """What a lifecycle hook (or a custom reader) may know about its member.

    Values are live: ``epoch`` and ``may_read`` always reflect the member's
    current state, so a long-running reader can keep one context around.
    """

    __slots__ = ("_machine", "_spawn", "consumer_group", "redis", "stream_prefix")

    def __init__(
        self,
        machine: MemberStateMachine,
        *,
        stream_prefix: str,
        consumer_group: str,
        redis: AsyncRedis,
        spawn: Callable[..., None] | None = None,
    ) -> None:
        self._machine = machine
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group
        self.redis = redis
        self._spawn = spawn

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the member (a custom shard reader).

        The task is cancelled when the member stops, so a hook can start a
        per-shard read loop in ``on_assigned`` and return at once; the loop
        should end by itself once ``may_read`` turns false.
        """
        if self._spawn is None:
            raise RuntimeError("this ShardContext is not attached to a running member")
        self._spawn(fn, *args)

    member_id = Forward[str]("_machine")
    consumer_name = Forward[str](
        "_machine", "member_id", doc="The Redis consumer name of this member (its member id)."
    )
    epoch = Forward[int]("_machine")

    @property
    def owned_shards(self) -> frozenset[int]:
        """Shards assigned to this member and not being drained."""
        return frozenset(self._machine.reading)

    def stream_key(self, shard: int) -> str:
        return stream_key(self.stream_prefix, shard)

    def may_read(self, shard: int) -> bool:
        """True while ``shard`` is assigned and the local lease is valid.

        Check it before *every* read: it turns false the moment the shard is
        revoked or lost, and when the lease runs out because heartbeats fail.
        """
        return self._machine.may_read(shard, monotonic_ms())

    def lease_remaining_ms(self) -> int:
        """How long reads stay allowed without another successful heartbeat.

        Bound blocking reads by it (``XREADGROUP ... BLOCK``), so no read
        outlives the lease.
        """
        return self._machine.lease_remaining_ms(monotonic_ms())
