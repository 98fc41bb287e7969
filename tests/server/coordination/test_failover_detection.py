"""A failover that lost a grant only one coordinator process saw.

Revision numbers cannot show this to another process: it never saw the lost
revision.  Every document write stamps the group with the Redis server
incarnation that took it, and a document write (every grant is one) on
another incarnation is refused until a correction round is open (this was the
simulation's pinned known gap).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
import redis.asyncio

from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import SimMember, create_group, metric, shards, stored_group

LEASE_S = 1.5
REGRESSIONS = "redis_stream_coord_metadata_regression_total"


async def test_a_promoted_replica_that_missed_a_grant_opens_a_correction_round(
    primary_and_replica: tuple[RedisServer, RedisServer],
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    primary, replica = primary_and_replica
    first = coordinator_factory(RedisTarget(primary.url, cluster=False))
    async with (
        httpx.AsyncClient(timeout=10) as http,
        redis.asyncio.Redis.from_url(primary.url, decode_responses=True) as p,
        redis.asyncio.Redis.from_url(replica.url, decode_responses=True) as r,
    ):
        await create_group(http, first, "fo", "g", 4)
        assert await p.wait(1, 5_000) == 1  # the replica has the group
        # The replica stops following: whatever the primary writes from now
        # on is what an asynchronous failover loses.
        await r.replicaof("NO", "ONE")
        m1 = SimMember(http, first.url, "fo", "g", "m1")
        await m1.heartbeat()
        await m1.heartbeat()
        assert m1.owned == {0, 1, 2, 3}  # m1 reads every shard, inside its lease

        # The endpoint moves to the promoted replica; a coordinator process
        # that never saw m1's grant serves the next member.
        second = coordinator_factory(RedisTarget(replica.url, cluster=False))
        m2 = SimMember(http, second.url, "fo", "g", "m2")
        view = await m2.heartbeat()
        assert shards(view) == [], view  # m1 may still be reading: nothing is granted
        assert view["status"] != "OK"
        assert (await stored_group(r, "fo", "g"))["correction"] is not None
        assert await metric(http, second, REGRESSIONS) == 1
        assert "last written by another Redis server" in second.log_path.read_text()

        # The round restamped the group: later heartbeats are not new
        # regressions, and once m1's lease is over m2 gets every shard.
        with anyio.fail_after(LEASE_S * 8):
            while m2.owned != {0, 1, 2, 3}:
                await anyio.sleep(0.2)
                await m2.heartbeat()
        assert await metric(http, second, REGRESSIONS) == 1
        assert (await stored_group(r, "fo", "g"))["correction"] is None


async def test_one_redis_server_never_opens_a_round_by_itself(
    any_redis: RedisTarget, coordinator_factory: Callable[..., CoordinatorProcess]
) -> None:
    """The stamp only differs after a server change: two processes on one
    Redis (standalone or cluster) hand shards over without a correction round."""
    first = coordinator_factory(any_redis)
    second = coordinator_factory(any_redis)
    async with httpx.AsyncClient(timeout=10) as http:
        await create_group(http, first, "nofo", "g", 4)
        m1 = SimMember(http, first.url, "nofo", "g", "m1")
        m2 = SimMember(http, second.url, "nofo", "g", "m2")
        with anyio.fail_after(LEASE_S * 8):
            while len(m1.owned) != 2 or len(m2.owned) != 2:
                await m1.heartbeat()
                await m2.heartbeat()
                await anyio.sleep(0.1)
        assert await metric(http, first, REGRESSIONS) == 0
        assert await metric(http, second, REGRESSIONS) == 0


async def test_steady_heartbeats_do_not_pay_for_the_stamp(
    redis_url: str, coordinator_factory: Callable[..., CoordinatorProcess]
) -> None:
    """INFO runs inside document writes only: steady heartbeats never call it."""
    coord = coordinator_factory(RedisTarget(redis_url, cluster=False))
    async with (
        httpx.AsyncClient(timeout=10) as http,
        redis.asyncio.Redis.from_url(redis_url, decode_responses=True) as r,
    ):
        await create_group(http, coord, "stamp", "g", 2)
        m1 = SimMember(http, coord.url, "stamp", "g", "m1")
        while m1.owned != {0, 1}:
            await m1.heartbeat()
        for _ in range(3):  # settle: the member turns ACTIVE, the group STABLE
            await m1.heartbeat()
        before = await _info_calls(r)
        for _ in range(10):
            await m1.heartbeat()
        assert await _info_calls(r) == before + 1  # our own INFO commandstats
        assert m1.owned == {0, 1}


async def _info_calls(r: redis.asyncio.Redis) -> int:
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))
