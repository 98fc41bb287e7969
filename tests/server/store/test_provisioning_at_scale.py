"""The provisioner at the shard limit, on a real standalone Redis and cluster.

A group of ``MAX_SHARD_COUNT`` shards used to cost two round trips per shard
to delete (about 8,000), which timed a client out on a loaded machine; the
provisioner now pipelines.  These tests check what it does at that size:
every shard gets its stream and group, collisions are found wherever they
are, and a delete removes the group from every shard and nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from streamkit.routing import stream_key
from streamkit.testing import RedisTarget
from streamkit_server.core.limits import MAX_SHARD_COUNT
from streamkit_server.store.provisioning import Provisioner
from streamkit_server.store.records import RedisClient

SHARDS = list(range(MAX_SHARD_COUNT))


@pytest.fixture
async def client(any_redis: RedisTarget) -> AsyncIterator[RedisClient]:
    redis: RedisClient
    if any_redis.cluster:
        redis = aioredis.RedisCluster.from_url(any_redis.url)
    else:
        redis = aioredis.Redis.from_url(any_redis.url)
    try:
        yield redis
    finally:
        await redis.aclose()


async def _groups(client: RedisClient, key: str) -> list[str]:
    return [g["name"].decode() for g in await client.xinfo_groups(key)]


async def test_a_full_size_group_is_provisioned_found_and_destroyed(client: RedisClient) -> None:
    provisioner = Provisioner(client)
    # A fresh node has never run the script: the NOSCRIPT replies load it once.
    await client.script_flush()
    await client.xadd(stream_key("big", 4000), {"k": "v"})  # one shard already holds data
    await client.set(stream_key("big", 17), "x")  # and one is taken by another type
    assert await provisioner.collisions("big", SHARDS) == sorted(
        [f"{stream_key('big', 17)} (string)", f"{stream_key('big', 4000)} (non-empty stream)"]
    )
    await client.delete(stream_key("big", 17))

    await provisioner.provision("big", SHARDS, "g")
    await provisioner.provision("big", SHARDS, "other")
    for shard in (0, 17, 2048, 4000, MAX_SHARD_COUNT - 1):
        assert await _groups(client, stream_key("big", shard)) == ["g", "other"]
    assert await client.xlen(stream_key("big", 4000)) == 1  # adopted, not emptied

    await provisioner.destroy_group("big", SHARDS, "g")
    for shard in (0, 17, 2048, 4000, MAX_SHARD_COUNT - 1):
        assert await _groups(client, stream_key("big", shard)) == ["other"]
    # Missing streams are fine: a second delete, and one over shards never made.
    await provisioner.destroy_group("big", [*SHARDS, MAX_SHARD_COUNT + 5], "g")


async def test_a_shard_of_another_type_stops_provisioning_with_its_name(
    client: RedisClient,
) -> None:
    await client.set(stream_key("typed", 3), "x")
    with pytest.raises(Exception, match=r"WRONGTYPE shard key typed:3 holds a string"):
        await Provisioner(client).provision("typed", list(range(8)), "g")
