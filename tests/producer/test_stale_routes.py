"""XADD NOMKSTREAM on a retired shard: never recreated, refreshed at once,
re-routed when fresh routing points elsewhere, one shared refresh for many."""

from __future__ import annotations

import pytest

from streamkit.publisher.publisher import StaleRouteError
from streamkit.routing import shard_for_key

from .conftest import Stack, gather


async def test_retired_shard_is_not_recreated(stack: Stack) -> None:
    pub = await stack.started_publisher(4)
    key = "order-123"  # SPEC vector: shard 1 of 3, here shard_for_key(key, 4)
    shard = shard_for_key(key, 4)
    await stack.redis.delete(stack.key(shard))

    with pytest.raises(StaleRouteError) as caught:
        await pub.publish(key, {"a": 1})
    err = caught.value
    assert (err.stream_key, err.shard_index, err.metadata_version) == (stack.key(shard), shard, 1)
    assert "does not exist" in str(err) and "still routes to it" in str(err)
    assert await stack.redis.exists(stack.key(shard)) == 0
    # The stale route was refreshed at once (no clock movement), found unchanged.
    assert pub.refresher.started == 2 and pub.stale_refreshes == 1
    assert pub.routing_failures == 1 and pub.published == 0

    # Right after that confirmation, publishes to the dead shard fail without
    # asking the coordinator again; other shards are unaffected.
    with pytest.raises(StaleRouteError):
        await pub.publish(key, {"a": 2})
    assert pub.refresher.started == 2
    other = next(f"k{i}" for i in range(100) if shard_for_key(f"k{i}", 4) != shard)
    assert (await pub.publish(other, {"a": 3})).shard_index == shard_for_key(other, 4)
    assert await stack.redis.exists(stack.key(shard)) == 0


async def test_stale_route_refreshes_at_once_and_reroutes(stack: Stack) -> None:
    pub = await stack.started_publisher(8)
    # Scale-in 8 -> 4, committed by the coordinator; shards 4..7 drained and
    # retired. This producer still has the 8-shard routing.
    assert await stack.rewrite_routing(shard_count=4) == 2
    for shard in range(4, 8):
        await stack.redis.delete(stack.key(shard))
    key = next(f"user-{i}" for i in range(100) if shard_for_key(f"user-{i}", 8) >= 4)

    result = await pub.publish(key, {"a": 1})
    assert (result.shard_index, result.metadata_version) == (shard_for_key(key, 4), 2)
    assert await stack.redis.exists(stack.key(shard_for_key(key, 8))) == 0
    assert pub.refresher.started == 2  # one immediate refresh, clock never moved
    assert pub.stale_refreshes == 1 and pub.retries == 1 and pub.published == 1
    entries = await stack.redis.xrange(result.stream_key)
    assert [rid.decode() for rid, _ in entries] == [result.record_id]


async def test_stale_batch_is_rerouted(stack: Stack) -> None:
    pub = await stack.started_publisher(8)
    await stack.rewrite_routing(shard_count=4)
    for shard in range(4, 8):
        await stack.redis.delete(stack.key(shard))
    keys = [f"user-{i}" for i in range(200)]
    results = await pub.publish_many([(k, {"k": k}) for k in keys])
    assert [r.shard_index for r in results] == [shard_for_key(k, 4) for k in keys]
    # Only the messages that hit a retired shard were re-routed with version 2;
    # the rest went, in the same round trip, where both versions agree.
    assert [r.metadata_version for r in results] == [
        2 if shard_for_key(k, 8) >= 4 else 1 for k in keys
    ]
    assert pub.refresher.started == 2
    assert sum([await stack.redis.xlen(stack.key(s)) for s in range(4)]) == 200
    assert await stack.redis.exists(*[stack.key(s) for s in range(4, 8)]) == 0


async def test_concurrent_stale_publishes_share_one_refresh(stack: Stack) -> None:
    pub = await stack.started_publisher(4)
    await stack.redis.delete(stack.key(1))
    keys = [f"k{i}" for i in range(400) if shard_for_key(f"k{i}", 4) == 1][:50]
    outcomes = await gather(*[lambda k=k: pub.publish(k, {"a": 1}) for k in keys])
    assert all(isinstance(o, StaleRouteError) for o in outcomes)
    assert pub.refresher.started == 2  # start + one refresh for all 50
    assert await stack.redis.exists(stack.key(1)) == 0
