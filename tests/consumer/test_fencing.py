"""A member whose drain outlasts the rebalance timeout is fenced, stops, calls
``on_lost`` and rejoins with epoch 0 (the natural way to miss heartbeat
deadlines without mocks: a slow ``on_revoked``)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from streamkit import Message, ShardContext

from .support import (
    Admin,
    InProcessApp,
    MemoryRecorder,
    all_acked,
    eventually,
    overlapping_reads,
    serving,
    settled_ownership,
)

pytestmark = pytest.mark.slow

SHARDS = 4


class StuckOnFirstRevoke:
    """Lifecycle hooks whose first ``on_revoked`` never finishes."""

    def __init__(self) -> None:
        self.revoke_entered_ns: int | None = None
        self.revoked: frozenset[int] = frozenset()
        self.revoke_cancelled = False
        self.lost: list[tuple[frozenset[int], int]] = []
        self.lost_ns: int | None = None

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        pass

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        if self.revoke_entered_ns is not None:
            return
        self.revoke_entered_ns = time.monotonic_ns()
        self.revoked = shards
        assert not any(ctx.may_read(shard) for shard in shards)
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.revoke_cancelled = True
            raise

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        self.lost.append((shards, ctx.epoch))
        self.lost_ns = self.lost_ns or time.monotonic_ns()


async def test_slow_drain_gets_fenced_then_rejoins(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    recorder = MemoryRecorder()
    hooks = StuckOnFirstRevoke()
    slow = make_app("slow", read_observer=recorder)
    fast = make_app("fast", read_observer=recorder)
    handled: set[str] = set()

    async def handle(msg: Message) -> None:
        handled.add(f"{msg.stream_key}/{msg.id}")
        await msg.ack()

    slow.add_listener(prefix, group, handle, lifecycle=hooks)
    fast.add_listener(prefix, group, handle)

    async def publish(count: int) -> set[str]:
        ids = set()
        for i in range(count):
            key = f"{prefix}:{i % SHARDS}"
            entry = await redis.xadd(key, {"n": str(i)})
            ids.add(f"{key}/{entry.decode()}")
        return ids

    async def owners() -> dict[str, list[int]]:
        return await admin.owners(prefix, group)

    with anyio.fail_after(40):
        async with serving(slow):
            await eventually(lambda: settled_ownership_of(owners, ["slow-m0"]), 10, "slow owns all")
            published = await publish(200)
            async with serving(fast):
                await eventually(lambda: hooks.revoke_entered_ns is not None, 10, "a revoke")
                published |= await publish(200)
                # Rebalance timeout (3 s) passes; the coordinator fences slow-m0.
                await eventually(lambda: bool(hooks.lost), 10, "on_lost after the fence")
                assert hooks.revoke_cancelled
                lost_shards, epoch_after = hooks.lost[0]
                assert hooks.revoked <= lost_shards
                assert epoch_after == 0  # state cleared before the hook runs
                (member,) = slow.members
                # It rejoins (epoch 0, empty ownership) and gets a fair share again.
                await eventually(
                    lambda: settled_ownership_of(owners, ["slow-m0", "fast-m0"]),
                    15,
                    "balanced again after the rejoin",
                )
                assert member.machine.epoch > 0
                published |= await publish(200)
                await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 15, "all acked")

    # From the revoke until the fence nothing read the revoked shards: the
    # poller had stopped before on_revoked was called.
    assert hooks.revoke_entered_ns is not None and hooks.lost_ns is not None
    revoked_reads = [
        r for r in recorder.reads if r.reader == "slow-m0" and r.shard in hooks.revoked
    ]
    assert revoked_reads, "slow-m0 never read the shards it later had revoked"
    for read in revoked_reads:
        assert read.end_ns <= hooks.revoke_entered_ns or read.start_ns >= hooks.lost_ns, read
    assert not overlapping_reads(recorder.all_reads())
    assert published <= handled


async def settled_ownership_of(owners: Any, members: list[str]) -> bool:
    return settled_ownership(await owners(), members, SHARDS)
