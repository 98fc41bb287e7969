"""10,000 keyed messages: every partition key lands in exactly one shard, the
one ``shard_for_key`` predicts, in publish order."""

from __future__ import annotations

from collections import defaultdict

import anyio

from streamkit.publisher.publisher import PublishResult
from streamkit.routing import shard_for_key

from .conftest import Stack

SHARDS = 8
KEYS = 1_000
PER_KEY = 10  # 10,000 messages
WORKERS = 16


async def test_ten_thousand_keyed_messages_land_where_routing_says(stack: Stack) -> None:
    await stack.create_group(SHARDS)
    pub = stack.publisher(fake_clock=False)
    keys = [f"customer-{i}" for i in range(KEYS)]
    results: dict[tuple[str, int], PublishResult] = {}

    async def worker(w: int) -> None:
        # Each key belongs to one worker, which publishes its messages in order;
        # half of them one by one, half in small batches.
        mine = keys[w::WORKERS]
        for seq in range(PER_KEY):
            if seq % 2 == 0:
                for key in mine:
                    results[key, seq] = await pub.publish(key, {"key": key, "seq": seq})
            else:
                batch = [(key, {"key": key, "seq": seq}) for key in mine]
                for key, result in zip(mine, await pub.publish_many(batch), strict=True):
                    results[key, seq] = result

    async with anyio.create_task_group() as tg:
        for w in range(WORKERS):
            tg.start_soon(worker, w)
    assert len(results) == KEYS * PER_KEY and pub.published == KEYS * PER_KEY

    shards_of: dict[str, set[int]] = defaultdict(set)
    seqs_of: dict[str, list[int]] = defaultdict(list)
    total = 0
    for shard in range(SHARDS):
        for record_id, data in await stack.redis.xrange(stack.key(shard)):
            key, seq = data[b"key"].decode(), int(data[b"seq"])
            shards_of[key].add(shard)
            seqs_of[key].append(seq)
            assert results[key, seq].record_id == record_id.decode()
            total += 1
    assert total == KEYS * PER_KEY
    for key in keys:
        assert shards_of[key] == {shard_for_key(key, SHARDS)}, key
        assert seqs_of[key] == list(range(PER_KEY)), key
    # A sanity check on the spread: every shard got a fair share.
    counts = [await stack.redis.xlen(stack.key(s)) for s in range(SHARDS)]
    assert min(counts) > 0.7 * total / SHARDS
