"""Two coordinator processes serving one group at once (mutex + revision CAS)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import API, SimMember, create_group, meta_key, metric, redis_of

Factory = Callable[..., CoordinatorProcess]
MEMBERS = 16
SHARDS = 32
_LEASE_MS = 4_000


async def _writes(http: httpx.AsyncClient, coords: list[CoordinatorProcess], name: str) -> float:
    return sum([await metric(http, c, name) for c in coords])


async def _why(http: httpx.AsyncClient, coord: CoordinatorProcess) -> str:
    """The locked writes by reason (a failure's message)."""
    text = (await http.get(f"{coord.url}/metrics", auth=coord.admin_auth)).text
    lines = text.splitlines()
    return "\n".join(line for line in lines if line.startswith("redis_stream_coord_locked"))


def _assert_disjoint(members: list[SimMember]) -> None:
    seen: dict[int, str] = {}
    for member in members:
        for shard in member.owned:
            assert shard not in seen, f"shard {shard} read by {seen[shard]} and {member.member_id}"
            seen[shard] = member.member_id


async def test_two_coordinators_concurrent_heartbeats_lose_no_update(
    any_redis: RedisTarget, coordinator_factory: Factory
) -> None:
    # The checks between the settled round and the silent members' expiry
    # assume every member is still live: a lease of 4 s (the suite's is 1.5 s)
    # leaves that room on a loaded machine, where a tick expiring the silent
    # members in between would rightly send a heartbeat down the locked path.
    coords = [coordinator_factory(any_redis, member_lease_ttl_ms=_LEASE_MS) for _ in range(2)]
    async with httpx.AsyncClient(timeout=10) as http, redis_of(any_redis) as r:
        await create_group(http, coords[0], "multi", "g", SHARDS)
        members = [
            SimMember(http, coords[i % 2].url, "multi", "g", f"m{i:02d}") for i in range(MEMBERS)
        ]

        async def round_(n: int, group: list[SimMember]) -> None:
            await asyncio.gather(
                *(m.heartbeat(base_url=coords[(i + n) % 2].url) for i, m in enumerate(group))
            )
            # Silent members are left out: their local lease has run out.
            _assert_disjoint(group)

        for n in range(30):
            await round_(n, members)
            if all(m.last_status == "OK" and not m.pending and not m.draining for m in members):
                break
        assert sorted(len(m.owned) for m in members) == [SHARDS // MEMBERS] * MEMBERS

        async def state() -> tuple[int, float]:
            revision = int(await r.hget(meta_key("multi", "g"), "revision"))
            return revision, await _writes(http, coords, "redis_stream_coord_store_writes_total")

        revision, writes = await state()
        assert revision == writes  # the create was revision 1; every write bumped it once

        # Steady heartbeats through one process take the one-round-trip write;
        # through the other one, right after, its copy is stale: the locked path.
        locked = "redis_stream_coord_locked_writes_total"
        await members[0].heartbeat(base_url=coords[0].url)  # its copy is now current
        before = [await metric(http, c, locked) for c in coords]
        for _ in range(3):
            await members[0].heartbeat(base_url=coords[0].url)
        assert await metric(http, coords[0], locked) == before[0], await _why(http, coords[0])
        # Through the other process right after: its copy missed writes of this
        # very member, so the locked path (unless its tick read the group since).
        await members[0].heartbeat(base_url=coords[1].url)
        after = await metric(http, coords[1], locked)
        assert after - before[1] in (0, 1)
        revision, writes = await state()
        assert revision == writes
        # Other members' heartbeats through the process that did not write
        # last: its copy missed only another member's record, so the write
        # still takes one round trip (bringing that record back, unless the
        # tick's read brought the copy forward first).
        await members[1].heartbeat(base_url=coords[0].url)
        await members[2].heartbeat(base_url=coords[1].url)
        assert [await metric(http, c, locked) for c in coords] == [before[0], after]
        revision, writes = await state()
        assert revision == writes
        view = (
            await http.get(
                f"{coords[1].url}{API}/monitoring/streams/multi/groups/g/members",
                auth=coords[1].admin_auth,
            )
        ).json()["members"]
        assert sorted(v["memberId"] for v in view) == sorted(m.member_id for m in members)
        assert {v["state"] for v in view} == {"ACTIVE"}
        assignments = (
            await http.get(
                f"{coords[0].url}{API}/monitoring/streams/multi/groups/g/assignments",
                auth=coords[0].admin_auth,
            )
        ).json()
        assert assignments["invariantViolations"] == []

        # Five members go silent: both processes tick, each expiry applies once.
        survivors = members[5:]
        deadline = time.monotonic() + 10
        n = 0
        while time.monotonic() < deadline:
            n += 1
            await round_(n, survivors)
            if sum(len(m.owned) for m in survivors) == SHARDS:
                break
            await asyncio.sleep(0.1)
        assert await _writes(http, coords, "redis_stream_coord_member_expired_total") == 5
        revision, writes = await state()
        assert revision == writes
        assert sum(len(m.owned) for m in survivors) == SHARDS
