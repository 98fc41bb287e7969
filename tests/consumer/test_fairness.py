"""Fair polling: one member owning 8 backlogged shards serves them all alike."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest

from streamkit import Message

from .support import Admin, InProcessApp, MemoryRecorder, eventually, serving

SHARDS = 8
BACKLOG = 1_000


@pytest.mark.parametrize(
    "max_in_flight",
    [10, 80],
    ids=["tokens-for-one-batch", "tokens-for-all-shards"],
)
async def test_backlogged_shards_get_equal_turns(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    max_in_flight: int,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    for shard in range(SHARDS):
        pipe = redis.pipeline(transaction=False)
        for i in range(BACKLOG):
            pipe.xadd(f"{prefix}:{shard}", {"n": str(i)})
        await pipe.execute()

    delivered: Counter[int] = Counter()
    app = make_app("fair", read_observer=MemoryRecorder())

    @app.stream_listener(
        stream_prefix=prefix, group=group, batch_size=10, max_in_flight=max_in_flight
    )
    async def handle(msg: Message) -> None:
        delivered[msg.shard] += 1
        await anyio.sleep(0.001)  # slow enough that the backlog outlives the run
        await msg.ack()

    with anyio.fail_after(30):
        async with serving(app):
            await eventually(lambda: sum(delivered.values()) > 0, 10, "first delivery")
            delivered.clear()
            # A window of at least a second, and long enough for several turns
            # per shard: on a starved machine one second may hold only one or
            # two batches per shard, too few to compare.
            await anyio.sleep(1.0)
            for _ in range(30):  # up to 3 s more
                if min(delivered[shard] for shard in range(SHARDS)) >= 30:
                    break
                await anyio.sleep(0.1)
            counts = [delivered[shard] for shard in range(SHARDS)]
            await anyio.sleep(0.3)  # one more heartbeat carries the latest report
            # The heartbeats report capacity and per-shard progress.
            (member,) = (await admin.members(prefix, group)).members
            assert member.model_extra is not None
            assert member.model_extra["runtimeMaxConcurrency"] == max_in_flight
            progress = (await admin.consumption(prefix, group)).progress
            assert sorted(p.shard.shard_index for p in progress if p.shard) == list(range(SHARDS))
            assert all(p.last_delivered_id and p.last_acked_id for p in progress), progress
    assert sum(counts) < SHARDS * BACKLOG, "the backlog ran out: the run proves nothing"
    assert min(counts) > 0, counts
    assert max(counts) < 2 * min(counts), counts
