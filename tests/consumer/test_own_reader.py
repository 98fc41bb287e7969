"""``app.shard_listener``: members without the built-in poller, the
application's ``ShardLifecycle`` does the reading (bring your own reader)."""

from __future__ import annotations

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

SHARDS = 4


class OwnReader:
    """One XREADGROUP loop per owned shard, started from ``on_assigned``."""

    def __init__(self, recorder: MemoryRecorder) -> None:
        self.recorder = recorder
        self.loops: dict[tuple[str, int], anyio.Event] = {}
        self.handled: set[str] = set()
        self.events: list[tuple[str, str, frozenset[int]]] = []

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        self.events.append(("assigned", ctx.member_id, shards))
        for shard in shards:
            done = self.loops[(ctx.member_id, shard)] = anyio.Event()
            ctx.start_soon(self.read, shard, ctx, done)

    async def read(self, shard: int, ctx: ShardContext, done: anyio.Event) -> None:
        key = ctx.stream_key(shard)
        try:
            while shard in ctx.owned_shards:  # still ours (the lease may lapse and return)
                block = min(200, ctx.lease_remaining_ms() - 20)
                if not ctx.may_read(shard) or block < 5:
                    await anyio.sleep(0.02)
                    continue
                self.recorder.read_started(shard, ctx.member_id, ctx.epoch)
                count = 0
                reply: Any = None
                try:
                    reply = await ctx.redis.xreadgroup(
                        ctx.consumer_group, ctx.consumer_name, {key: ">"}, count=20, block=block
                    )
                    entries: list[tuple[bytes, Any]] = reply[0][1] if reply else []
                    count = len(entries)
                finally:
                    self.recorder.read_finished(shard, ctx.member_id, ctx.epoch, count)
                if entries:
                    self.handled.update(f"{key}/{entry_id.decode()}" for entry_id, _ in entries)
                    await ctx.redis.xack(key, ctx.consumer_group, *[e for e, _ in entries])
        finally:
            done.set()

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        self.events.append(("revoked", ctx.member_id, shards))
        for shard in shards:  # drained once the loop has stopped (it acks as it goes)
            await self.loops.pop((ctx.member_id, shard)).wait()

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        self.events.append(("lost", ctx.member_id, shards))


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_custom_reader_shares_a_group_with_the_poller(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    recorder = MemoryRecorder()
    reader = OwnReader(recorder)
    own = make_app("own")
    own.shard_listener(stream_prefix=prefix, group=group, concurrency=2, lifecycle=reader)
    builtin = make_app("kit", read_observer=recorder)
    polled: set[str] = set()

    @builtin.stream_listener(stream_prefix=prefix, group=group)
    async def handle(msg: Message) -> None:
        polled.add(f"{msg.stream_key}/{msg.id}")
        await msg.ack()

    async def publish(count: int) -> set[str]:
        ids = set()
        for i in range(count):
            key = f"{prefix}:{i % SHARDS}"
            ids.add(f"{key}/{(await redis.xadd(key, {'n': str(i)})).decode()}")
        return ids

    async def settled(members: list[str]) -> bool:
        return settled_ownership(await admin.owners(prefix, group), members, SHARDS)

    with anyio.fail_after(30):
        async with serving(own):
            await eventually(lambda: settled(["own-m0", "own-m1"]), 10, "custom readers own all")
            published = await publish(200)
            await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 10, "read by own")
            async with serving(builtin):
                await eventually(
                    lambda: settled(["own-m0", "own-m1", "kit-m0"]), 10, "shared with the poller"
                )
                published |= await publish(200)
                await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 10, "all acked")
    assert any(kind == "revoked" for kind, _, _ in reader.events)
    assert not any(kind == "lost" for kind, _, _ in reader.events)
    assert published <= reader.handled | polled
    assert not overlapping_reads(recorder.all_reads())
