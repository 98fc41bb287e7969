"""Resharding endpoints over real HTTP against real Redis (standalone and cluster).

Members are raw-HTTP ``SimConsumer``s that read with plain XREADGROUP, and
messages are written with raw XADD, so these tests exercise the coordinator
alone; ``test_e2e.py`` runs the real consumer runtime and ``Publisher``.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import anyio
import httpx
import pytest

from streamkit.routing import redis_cluster_slot
from streamkit.testing import AsyncRedisClient

from .support import PRODUCER_LEASE_MS, Admin, SimConsumer, eventually

KP = "redis-stream:coord"


async def redis_groups(r: AsyncRedisClient, key: str) -> set[str]:
    return {g["name"] for g in await r.xinfo_groups(key)}


async def test_scale_out_provisions_first_and_moves_every_group(
    admin: Admin, r: AsyncRedisClient, prefix: str
) -> None:
    await admin.create_stream(prefix, 4)
    await admin.create_group(prefix, "g1")
    await admin.create_group(prefix, "g2")
    response = await admin.scale(prefix, 8)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["streamPrefix"] == prefix and body["targetShardCount"] == 8
    assert body["affectedConsumerGroups"] == ["g1", "g2"]
    (rid,) = {m["reshardingId"] for m in body["migrations"]}  # one id for the stream
    for m in body["migrations"]:
        assert (m["fromShardCount"], m["toShardCount"], m["state"]) == (4, 8, "ACTIVE")
        assert m["addedShards"] == [4, 5, 6, 7] and m["removedShards"] == []
        assert m["requestedBy"] == "tests" and m["ordering"] == "none"
    # Routed only after the new streams and every group's Redis group exist.
    for shard in range(4, 8):
        assert await redis_groups(r, f"{prefix}:{shard}") == {"g1", "g2"}
    routing = await admin.routing(prefix, "g2")
    assert routing["shardCount"] == 8 and routing["streamKeyPattern"] == f"{prefix}:{{shardIndex}}"
    assert [(s["shardIndex"], s["streamKey"]) for s in routing["shards"]] == [
        (i, f"{prefix}:{i}") for i in range(8)
    ]
    assert routing["shards"][5]["redisSlot"] == redis_cluster_slot(f"{prefix}:5")

    # One active migration per stream; no group joins a stream mid-migration.
    busy = await admin.scale(prefix, 6)
    assert busy.status_code == 409 and busy.json()["errorCode"] == "ACTIVE_MIGRATION_EXISTS"
    late = await admin.post(f"/streams/{prefix}/groups/g3", {"requestedBy": "t"})
    assert late.status_code == 409 and late.json()["errorCode"] == "ACTIVE_MIGRATION_EXISTS"
    listed = (await admin.get(f"/monitoring/streams/{prefix}/groups/g1/migrations")).json()
    assert listed["activeReshardingId"] == rid and listed["migrations"][0]["state"] == "ACTIVE"
    # Nor does a group leave mid-migration: its Redis groups are part of the drain proof.
    gone = await admin.http.request(
        "DELETE",
        f"{admin.url}/coord/v1/streams/{prefix}/groups/g2",
        json={"requestedBy": "tests", "reason": "mid-migration", "force": True},
        auth=admin.coordinator.admin_auth,
    )
    assert gone.status_code == 409 and gone.json()["errorCode"] == "ACTIVE_MIGRATION_EXISTS"
    age = f'redis_stream_coord_resharding_active_age_seconds{{stream_prefix="{prefix}"}}'

    async def age_shown() -> bool:
        scraped = await admin.http.get(f"{admin.url}/metrics", auth=admin.coordinator.admin_auth)
        return age in scraped.text

    await eventually(age_shown, 5, "the migration's age gauge")

    # A scale-out has nothing to drain: done once the producer lease has passed.
    await admin.wait_state(prefix, ["g1", "g2"], rid, "DEPRECATED", within=10)
    listed = (await admin.get(f"/monitoring/streams/{prefix}/groups/g1/migrations")).json()
    assert listed["activeReshardingId"] is None and len(listed["migrations"]) == 1

    async def age_gone() -> bool:
        return not await age_shown()

    await eventually(age_gone, 5, "the age gauge dropped")
    record = await r.hgetall(f"{KP}:{{{prefix}}}:stream")
    assert record["shardCount"] == "8" and json.loads(record["layout"]) == list(range(8))
    assert json.loads(record["groups"]) == ["g1", "g2"]

    # A group created later starts from the stream's current layout.
    await admin.create_group(prefix, "g3")
    assert (await admin.routing(prefix, "g3"))["shardCount"] == 8
    assert await redis_groups(r, f"{prefix}:7") == {"g1", "g2", "g3"}

    # The per-group compatibility path scales the whole stream too.
    response = await admin.post(
        f"/streams/{prefix}/groups/g1/scale",
        {"targetShardCount": 6, "requestedBy": "tests", "reason": "compat"},
    )
    assert response.status_code == 202, response.text
    migration = response.json()
    assert (migration["fromShardCount"], migration["toShardCount"]) == (8, 6)
    assert migration["removedShards"] == [6, 7]
    rid = migration["reshardingId"]
    for group in ("g2", "g3"):
        assert (await admin.migration(prefix, group, rid))["toShardCount"] == 6
    await admin.wait_state(prefix, ["g1", "g2", "g3"], rid, "DEPRECATED")
    assert await r.exists(f"{prefix}:6", f"{prefix}:7") == 0  # empty: retired at once


async def test_refused_requests_leave_the_stream_alone(
    admin: Admin, http: httpx.AsyncClient, r: AsyncRedisClient, prefix: str
) -> None:
    missing = await admin.scale(prefix, 2)
    assert missing.status_code == 404 and missing.json()["errorCode"] == "STREAM_NOT_FOUND"
    await admin.create_stream(prefix, 4)
    lonely = await admin.scale(prefix, 2)
    assert lonely.status_code == 409 and lonely.json()["errorCode"] == "NO_CONSUMER_GROUPS"
    await admin.create_group(prefix, "g")
    cases = {
        4: (422, "SHARD_COUNT_UNCHANGED"),
        -1: (400, "INVALID_TARGET_SHARD_COUNT"),
        10**6: (400, "INVALID_TARGET_SHARD_COUNT"),
    }
    for target, (status, code) in cases.items():
        refused = await admin.scale(prefix, target)
        assert (refused.status_code, refused.json()["errorCode"]) == (status, code), target
    no_reason = await admin.post(f"/streams/{prefix}/scale", {"targetShardCount": 2})
    assert no_reason.status_code == 400
    anonymous = await http.post(
        f"{admin.url}/coord/v1/streams/{prefix}/scale",
        json={"targetShardCount": 2, "requestedBy": "x", "reason": "y"},
    )
    assert anonymous.status_code == 401
    unknown_group = await admin.post(
        f"/streams/{prefix}/groups/nope/scale",
        {"targetShardCount": 2, "requestedBy": "t", "reason": "r"},
    )
    assert unknown_group.status_code == 404
    assert unknown_group.json()["errorCode"] == "GROUP_NOT_FOUND"
    gone = await admin.get(f"/streams/{prefix}/groups/g/migrations/rs-nope")
    assert gone.status_code == 404 and gone.json()["errorCode"] == "MIGRATION_NOT_FOUND"
    assert (await admin.rollback(prefix, "g", "rs-nope")).status_code == 404
    assert (await admin.group(prefix, "g"))["activeMigration"] is None
    assert (await admin.routing(prefix, "g"))["shardCount"] == 4


async def test_scale_in_retires_a_shard_only_after_the_drain_proof(
    admin: Admin, http: httpx.AsyncClient, r: AsyncRedisClient, prefix: str
) -> None:
    await admin.create_group(prefix, "g", 8)
    members = [SimConsumer(http, admin.coordinator, r, prefix, "g", f"m{i}") for i in range(3)]
    written = {f"{prefix}:{s}/{await r.xadd(f'{prefix}:{s}', {'n': str(s)})}" for s in range(8)}
    # Shard 7's backlog is not read until we say so: its drain proof must wait.
    for member in members:
        member.skip.add(7)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for member in members:
            tg.start_soon(member.run, stop)
        rid = await admin.scale_ok(prefix, 3)
        # A producer still inside its routing lease writes to a removed shard
        # after the switch: that entry must be read too.
        late = await r.xadd(f"{prefix}:6", {"n": "late"})
        written.add(f"{prefix}:6/{late}")
        routing = await admin.routing(prefix, "g")
        assert routing["shardCount"] == 3
        assert [s["streamKey"] for s in routing["shards"]] == [f"{prefix}:{i}" for i in range(3)]

        async def others_retired() -> bool:
            return await r.exists(*[f"{prefix}:{s}" for s in range(3, 7)]) == 0

        await eventually(others_retired, 10, "shards 3-6 retired")
        migration = await admin.migration(prefix, "g", rid)
        assert migration["state"] == "DRAINING" and migration["retiredShards"] == [3, 4, 5, 6]
        assert await r.exists(f"{prefix}:7") == 1  # lag 1: not proven, kept
        offsets = (await admin.get(f"/monitoring/streams/{prefix}/groups/g/offsets")).json()
        assert [o["shard"]["shardIndex"] for o in offsets["shards"]] == [0, 1, 2, 7]
        assert offsets["shards"][-1]["lag"] == 1
        page = await admin.get(f"/monitoring/streams/{prefix}/groups/g/shards/7/messages")
        assert page.status_code == 200 and len(page.json()["records"]) == 1

        for member in members:
            member.skip.clear()
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=10)
        stop.set()
    assert await r.exists(f"{prefix}:7") == 0
    handled = sum((m.handled for m in members), start=Counter[str]())
    assert set(handled) == written
    retired = await admin.get(f"/monitoring/streams/{prefix}/groups/g/shards/7/messages")
    assert retired.status_code == 404
    targets = (await admin.get(f"/monitoring/streams/{prefix}/groups/g/assignments")).json()
    assert sorted(
        s["shardIndex"] for shards in targets["targetAssignment"].values() for s in shards
    ) == [0, 1, 2]
    assert targets["invariantViolations"] == []


async def test_scale_in_with_every_member_dead_waits_for_the_redis_drain(
    admin: Admin, http: httpx.AsyncClient, r: AsyncRedisClient, prefix: str
) -> None:
    await admin.create_group(prefix, "g", 4)
    dead = SimConsumer(http, admin.coordinator, r, prefix, "g", "dead", ack=False)
    for _ in range(3):
        await dead.step()  # joins, owns everything
    assert dead.member.owned == {0, 1, 2, 3}
    first = await r.xadd(f"{prefix}:3", {"n": "read, never acked"})
    await dead.step()  # reads it without acking: pending 1
    assert f"{prefix}:3/{first}" in dead.handled
    second = await r.xadd(f"{prefix}:2", {"n": "never read"})
    # The member dies (no leave): nobody can report a revoke.
    rid = await admin.scale_ok(prefix, 2)
    await anyio.sleep(3.5)  # member lease (1.5 s) and producer lease (1.5 s) both pass
    migration = await admin.migration(prefix, "g", rid)
    assert migration["state"] == "DRAINING" and migration["retiredShards"] == []
    assert await r.exists(f"{prefix}:2", f"{prefix}:3") == 2
    members = (await admin.get(f"/monitoring/streams/{prefix}/groups/g/members")).json()
    assert [m["state"] for m in members["members"]] == ["EXPIRED"]

    # A consumer started later takes the removed shards (still assignable),
    # claims the dead member's pending entry and reads the rest.
    later = SimConsumer(http, admin.coordinator, r, prefix, "g", "later")
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(later.run, stop)
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=10)
        stop.set()
    assert {f"{prefix}:3/{first}", f"{prefix}:2/{second}"} <= set(later.handled)
    assert await r.exists(f"{prefix}:2", f"{prefix}:3") == 0


async def test_scale_to_zero_routes_nothing_and_drains_everything(
    admin: Admin, http: httpx.AsyncClient, r: AsyncRedisClient, prefix: str
) -> None:
    await admin.create_group(prefix, "g", 3)
    member = SimConsumer(http, admin.coordinator, r, prefix, "g", "m")
    ids = {f"{prefix}:{s}/{await r.xadd(f'{prefix}:{s}', {'n': '1'})}" for s in range(3)}
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(member.run, stop)
        rid = await admin.scale_ok(prefix, 0)
        routing = await admin.routing(prefix, "g")
        assert routing["shardCount"] == 0 and routing["shards"] == []
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=10)
        assert set(member.handled) == ids
        assert await r.exists(*[f"{prefix}:{s}" for s in range(3)]) == 0
        # ...and back: a stream at zero shards scales out like any other.
        back = await admin.scale_ok(prefix, 2)
        assert (await admin.routing(prefix, "g"))["shardCount"] == 2
        assert await redis_groups(r, f"{prefix}:1") == {"g"}
        await admin.wait_state(prefix, ["g"], back, "DEPRECATED", within=10)
        stop.set()


async def test_rollback_while_allowed_and_refused_once_a_shard_is_retired(
    admin: Admin, http: httpx.AsyncClient, r: AsyncRedisClient, prefix: str
) -> None:
    await admin.create_group(prefix, "g1", 4)
    await admin.create_group(prefix, "g2")
    members = [
        SimConsumer(http, admin.coordinator, r, prefix, group, f"m-{group}")
        for group in ("g1", "g2")
    ]
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for member in members:
            tg.start_soon(member.run, stop)
        # The rollback must come within the producer lease (1.5 s), before the
        # scale-out completes.  On a loaded machine the calls can take longer:
        # a refusal then is only acceptable if the lease really passed, and
        # the scale-out is tried again from the layout it reached.
        base = 4
        for _ in range(3):
            started = time.monotonic()
            rid = await admin.scale_ok(prefix, base + 2)
            # A producer already writing to the new layout.
            entry = await r.xadd(f"{prefix}:{base + 1}", {"n": "routed to an added shard"})
            rolled = await admin.rollback(prefix, "g1", rid)
            if rolled.status_code == 202:
                break
            assert time.monotonic() - started >= PRODUCER_LEASE_MS / 1000, rolled.text
            assert rolled.json()["errorCode"] == "ROLLBACK_NOT_ALLOWED", rolled.text
            await admin.wait_state(prefix, ["g1", "g2"], rid, "DEPRECATED", within=10)
            base += 2
        else:
            pytest.fail("every rollback came after the producer lease (machine too slow)")
        assert rolled.json()["state"] == "ROLLING_BACK"
        assert rolled.json()["removedShards"] == [base, base + 1]  # the added shards drain now
        assert (await admin.migration(prefix, "g2", rid))["state"] == "ROLLING_BACK"
        for group in ("g1", "g2"):
            assert (await admin.routing(prefix, group))["shardCount"] == base
        again = await admin.rollback(prefix, "g2", rid)
        assert again.status_code == 422 and again.json()["errorCode"] == "ROLLBACK_NOT_ALLOWED"
        await admin.wait_state(prefix, ["g1", "g2"], rid, "ROLLED_BACK", within=10)
        assert all(f"{prefix}:{base + 1}/{entry}" in m.handled for m in members)
        assert await r.exists(f"{prefix}:{base}", f"{prefix}:{base + 1}") == 0

        # Scale-in: once one removed shard is retired there is no way back.
        for member in members:
            member.skip.add(3)
        await r.xadd(f"{prefix}:3", {"n": "keeps shard 3 draining"})
        rid = await admin.scale_ok(prefix, 2)

        async def shard_2_retired() -> bool:
            return await r.exists(f"{prefix}:2") == 0

        await eventually(shard_2_retired, 10, "shard 2 retired")
        refused = await admin.rollback(prefix, "g2", rid)
        assert refused.status_code == 422, refused.text
        assert refused.json()["errorCode"] == "ROLLBACK_NOT_ALLOWED"
        assert "retired" in refused.json()["message"]
        for member in members:
            member.skip.clear()
        await admin.wait_state(prefix, ["g1", "g2"], rid, "DEPRECATED", within=10)
        done = await admin.rollback(prefix, "g1", rid)
        assert done.status_code == 422
        stop.set()


async def test_ordered_reshard_reads_new_shards_only_after_the_old_ones_are_gone(
    admin: Admin, http: httpx.AsyncClient, r: AsyncRedisClient, prefix: str
) -> None:
    await admin.create_stream(prefix, 4, ordering="key")
    await admin.create_group(prefix, "g")
    member = SimConsumer(http, admin.coordinator, r, prefix, "g", "m")
    member.skip.add(0)  # keeps parent 0 undrained until we let go
    old = await r.xadd(f"{prefix}:0", {"n": "old"})
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(member.run, stop)
        rid = await admin.scale_ok(prefix, 8)
        migration = await admin.migration(prefix, "g", rid)
        assert migration["ordering"] == "key" and migration["addedShards"] == list(range(4, 12))
        routing = await admin.routing(prefix, "g")
        assert [s["streamKey"] for s in routing["shards"]] == [
            f"{prefix}:{i}" for i in range(4, 12)
        ]
        new = await r.xadd(f"{prefix}:9", {"n": "new"})
        await anyio.sleep(3.0)  # well past the producer lease: parents 1-3 retire
        assert await r.exists(*[f"{prefix}:{s}" for s in (1, 2, 3)]) == 0
        assert f"{prefix}:9/{new}" not in member.handled  # held behind parent 0
        assert member.member.owned <= {0}
        member.skip.clear()
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=10)
        await eventually(
            lambda: _true(f"{prefix}:9/{new}" in member.handled), 5, "child read after parents"
        )
        stop.set()
    assert f"{prefix}:0/{old}" in member.handled
    record = await r.hgetall(f"{KP}:{{{prefix}}}:stream")
    assert json.loads(record["layout"]) == list(range(4, 12)) and record["ordering"] == "key"
    await admin.create_group(prefix, "late")
    late = await admin.routing(prefix, "late")
    assert [s["streamKey"] for s in late["shards"]] == [f"{prefix}:{i}" for i in range(4, 12)]
    # The stream's mode can be overridden per scale: an unordered scale-out
    # appends the lowest free shard numbers.
    rid = await admin.scale_ok(prefix, 10, ordering="none")
    assert (await admin.migration(prefix, "g", rid))["addedShards"] == [0, 1]


async def _true(value: bool) -> bool:
    return value
