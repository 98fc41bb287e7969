"""Coordinator crashes (SIGKILL): a new process resumes from Redis, never from memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import API, SimMember, create_group, meta_key, redis_of, stored_group

Factory = Callable[..., CoordinatorProcess]
# Long enough that a coordinator restart does not expire anyone.
SLOW = {"heartbeat_interval_ms": 500, "member_lease_ttl_ms": 8_000, "rebalance_timeout_ms": 30_000}


async def _owners(target: RedisTarget, prefix: str) -> dict[str, str]:
    async with redis_of(target) as r:
        group = await stored_group(r, prefix, "g")
    owners: dict[str, str] = group["owners"]
    return owners


async def test_coordinator_down_while_member_drains_then_handoff_resumes(
    any_redis: RedisTarget, coordinator_factory: Factory
) -> None:
    first = coordinator_factory(any_redis, **SLOW)
    async with httpx.AsyncClient() as http:
        await create_group(http, first, "down", "g", 4)
        m1 = SimMember(http, first.url, "down", "g", "m1", auto_revoke=False)
        m2 = SimMember(http, first.url, "down", "g", "m2")
        await m1.heartbeat()
        await m1.heartbeat()
        await m2.heartbeat()
        await m1.heartbeat()  # DRAIN delivered
        moving = set(m1.draining)
        assert moving and moving == m2.pending
        first.kill()

        # Nobody can be handed m1's shards while no coordinator runs.
        assert {int(s) for s, o in (await _owners(any_redis, "down")).items() if o == "m1"} == {
            0, 1, 2, 3
        }  # fmt: skip

        second = coordinator_factory(any_redis, **SLOW)
        for member in (m1, m2):
            member.base_url = second.url
        await m2.heartbeat()
        assert m2.owned == set() and m2.pending == moving  # still blocked by m1's drain
        await m1.heartbeat(draining=moving)
        await m2.heartbeat()
        assert m2.owned == set()
        await m1.heartbeat(revoked=moving, draining=())
        await m2.heartbeat()
        assert m2.owned == moving and m1.owned == {0, 1, 2, 3} - moving


async def test_coordinator_killed_mid_rebalance_new_one_completes_it(
    any_redis: RedisTarget, coordinator_factory: Factory
) -> None:
    options: dict[str, Any] = {**SLOW, "env": {"STREAMKIT_SERVER_MUTEX_TTL_MS": "1000"}}
    first = coordinator_factory(any_redis, **options)
    async with httpx.AsyncClient() as http:
        await create_group(http, first, "crash", "g", 4)
        members = [SimMember(http, first.url, "crash", "g", f"m{i}") for i in range(3)]
        await members[0].heartbeat()
        await members[0].heartbeat()
        await members[1].heartbeat()  # rebalance recorded: targets moved, shards still held
        async with redis_of(any_redis) as r:
            revision = int(await r.hget(meta_key("crash", "g"), "revision"))
            # The crash happens inside a critical section: its mutex stays
            # behind until its TTL runs out.
            mutex = meta_key("crash", "g").replace(":metadata", ":mutex")
            await r.set(mutex, "dead-process-token", px=1000)
        first.kill()

        second = coordinator_factory(any_redis, **options)
        for member in members:
            member.base_url = second.url
        await members[2].heartbeat()  # waits out the dead holder's mutex (or RETRY)
        for _ in range(10):
            for member in members:
                await member.heartbeat()
            if all(not m.pending and not m.draining for m in members):
                break
        sizes = sorted(len(m.owned) for m in members)
        assert sizes == [1, 1, 2]
        assert set().union(*(m.owned for m in members)) == {0, 1, 2, 3}
        async with redis_of(any_redis) as r:
            assert int(await r.hget(meta_key("crash", "g"), "revision")) > revision
        view = await http.get(
            f"{second.url}{API}/monitoring/streams/crash/groups/g/assignments",
            auth=second.admin_auth,
        )
        assert view.json()["invariantViolations"] == []
        assert view.json()["revokeProgress"] == {}
