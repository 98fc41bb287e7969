"""Routing changes made by the coordinator's own scale endpoint (scaleStreamShards)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from streamkit.routing import shard_for_key

from .conftest import API, Stack, eventually


async def scale(stack: Stack, target: int) -> dict[str, Any]:
    """Scale the stream and wait until the coordinator routes with ``target`` shards."""
    async with httpx.AsyncClient(
        base_url=stack.coordinator.url, auth=stack.coordinator.admin_auth
    ) as http:
        answer = await http.post(
            f"{API}/streams/{stack.prefix}/scale",
            json={"targetShardCount": target, "requestedBy": "tests", "reason": "producer"},
        )
        assert answer.status_code == 202, answer.text
        with anyio.fail_after(15):
            while True:
                routing: dict[str, Any] = (
                    await http.get(
                        f"{API}/streams/{stack.prefix}/groups/{stack.group}/producer-routing"
                    )
                ).json()
                if routing["shardCount"] == target:
                    return routing
                await anyio.sleep(0.05)


def routed_key(routing: dict[str, Any], partition_key: str) -> str:
    index = shard_for_key(partition_key, routing["shardCount"])
    return next(s["streamKey"] for s in routing["shards"] if s["shardIndex"] == index)


async def test_scale_out_is_picked_up_by_the_periodic_refresh(stack: Stack) -> None:
    pub = await stack.started_publisher(4)
    routing = await scale(stack, 8)
    keys = [f"user-{i}" for i in range(100)]

    before = await pub.publish_many([(k, {"k": k}) for k in keys])  # inside the interval
    assert {r.metadata_version for r in before} == {1}
    assert [r.shard_index for r in before] == [shard_for_key(k, 4) for k in keys]

    stack.clock.advance(6)
    await pub.publish("k", {"a": 1})  # schedules the refresh
    await eventually(lambda: pub.metadata_version == routing["metadataVersion"])
    after = await pub.publish_many([(k, {"k": k}) for k in keys])
    assert [r.stream_key for r in after] == [routed_key(routing, k) for k in keys]
    assert all([await stack.redis.exists(r.stream_key) for r in after])


async def test_retired_shards_after_scale_in_reroute_at_once(stack: Stack) -> None:
    pub = await stack.started_publisher(8)
    routing = await scale(stack, 4)
    live = {s["streamKey"] for s in routing["shards"]}
    removed = [stack.key(i) for i in range(8) if stack.key(i) not in live]
    assert removed
    # The coordinator keeps removed shards readable until drained; retire them
    # now (what it does once they are drained) while this producer still has
    # the 8-shard routing and the clock has not moved.
    for key in removed:
        await stack.redis.delete(key)
    keys = [f"user-{i}" for i in range(200)]
    results = await pub.publish_many([(k, {"k": k}) for k in keys])
    assert [r.stream_key for r in results] == [routed_key(routing, k) for k in keys]
    assert pub.refresher.started == 2  # one immediate refresh for the whole batch
    assert await stack.redis.exists(*removed) == 0
    result = await pub.publish("order-1", {"a": 1})
    assert (result.stream_key, result.metadata_version) == (
        routed_key(routing, "order-1"),
        routing["metadataVersion"],
    )
