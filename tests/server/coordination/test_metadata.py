"""Redis metadata loss and rollback: fail closed, correct through SYNC_METADATA."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import (
    API,
    SimMember,
    create_group,
    meta_key,
    metric,
    redis_of,
    restore,
    shards,
    snapshot,
    stored_group,
)

LEASE_S = 1.5


async def test_deleted_metadata_fails_closed_and_is_never_rebuilt(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        await create_group(http, coordinator, "lost", "g", 2)
        m1 = SimMember(http, coordinator.url, "lost", "g", "m1")
        await m1.heartbeat()
        before = await metric(http, coordinator, "redis_stream_coord_metadata_missing_total")
        await r.delete(meta_key("lost", "g"))

        for body in (m1.body(), m1.body(epoch=0, owned=())):  # current epoch, and a rejoin
            response = await m1.post(body)
            assert response.status_code == 404
            error = response.json()
            assert error["status"] == "404" and error["errorCode"] == "GROUP_NOT_FOUND"
            assert "streamkit group create lost g" in error["message"]
        after = await metric(http, coordinator, "redis_stream_coord_metadata_missing_total")
        assert after - before == 2
        routing = await http.get(
            f"{coordinator.url}{API}/streams/lost/groups/g/producer-routing",
            auth=coordinator.admin_auth,
        )
        assert routing.status_code == 404
        await anyio.sleep(0.3)  # several tick passes
        assert await r.exists(meta_key("lost", "g")) == 0


async def _stable_single_owner(
    http: httpx.AsyncClient, coordinator: CoordinatorProcess, prefix: str
) -> SimMember:
    await create_group(http, coordinator, prefix, "g", 4)
    m1 = SimMember(http, coordinator.url, prefix, "g", "m1", auto_revoke=False)
    await m1.heartbeat()
    await m1.heartbeat()
    await m1.heartbeat()
    assert m1.owned == {0, 1, 2, 3} and m1.last_status == "OK"
    return m1


async def test_redis_rollback_is_corrected_through_sync_metadata(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    key = meta_key("rollback", "g")
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        m1 = await _stable_single_owner(http, coordinator, "rollback")
        saved = await snapshot(r, "rollback", "g")  # version N-1
        stored_version = m1.version
        m2 = SimMember(http, coordinator.url, "rollback", "g", "m2")
        await m2.heartbeat()  # m2 joins: N
        await m1.heartbeat()  # m1 is told to drain two shards and sees N+1
        assert m1.draining and m1.version > stored_version
        seen = m1.version
        regression_metric = "redis_stream_coord_metadata_regression_total"
        regressions = await metric(http, coordinator, regression_metric)
        await restore(r, "rollback", "g", saved)  # Redis goes back to N-1

        first = await m1.heartbeat(apply=False)
        assert first["status"] == "SYNC_METADATA"
        assert first["metadataVersion"] == stored_version < seen
        # Lost and repeated: the same answer again.
        second = await m1.heartbeat(apply=False)
        assert {**first, "responseTo": None} == {**second, "responseTo": None}
        assert int(await r.hget(key, "revision")) >= int(saved["revision"])
        assert await metric(http, coordinator, regression_metric) > regressions
        round_started = time.monotonic()

        # Redis never heard of m2: it must rejoin and gets nothing new for now.
        assert (await m2.heartbeat())["status"] == "UNKNOWN_MEMBER_ID"
        await m1.heartbeat()  # applies SYNC_METADATA: keeps what it still reads
        assert m1.version == stored_version
        # Still draining what it gave up: blocked.
        view = await m1.heartbeat(draining=set(m1.draining))
        assert view["status"] == "REVOKE_PENDING"
        statuses = []
        ok_at = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            view = await m1.heartbeat(revoked=set(m1.draining), draining=())
            statuses.append(view["status"])
            if view["status"] == "OK":
                ok_at = time.monotonic()
                break
            # A synced member stays drain-only until the round closes.
            assert view["status"] == "REVOKE_PENDING", (view, statuses)
            assert time.monotonic() - round_started < LEASE_S + 1.0
            await anyio.sleep(0.1)
        assert ok_at is not None, statuses
        assert ok_at - round_started >= LEASE_S
        await m1.heartbeat()
        assert m1.owned == {0, 1, 2, 3}
        # The stored version was never bumped to match the client's.
        group = await stored_group(r, "rollback", "g")
        assert group["correction"] is None


async def test_concurrent_stale_revokes_during_correction_change_nothing_unsupported(
    coordinator_factory: Callable[..., CoordinatorProcess], any_redis: RedisTarget
) -> None:
    # Nothing here waits for a lease: a long one keeps members from expiring
    # between heartbeats on a loaded machine, which would move shards.
    coordinator = coordinator_factory(
        any_redis, member_lease_ttl_ms=20_000, rebalance_timeout_ms=40_000
    )
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        await create_group(http, coordinator, "stale", "g", 4)
        m1 = SimMember(http, coordinator.url, "stale", "g", "m1")
        m2 = SimMember(http, coordinator.url, "stale", "g", "m2")
        for _ in range(4):
            await m1.heartbeat()
            await m2.heartbeat()
        assert len(m1.owned) == len(m2.owned) == 2
        saved = await snapshot(r, "stale", "g")
        before = await stored_group(r, "stale", "g")

        # Lost writes: m3 joins and takes a shard from m2.
        m3 = SimMember(http, coordinator.url, "stale", "g", "m3")
        for _ in range(4):
            for member in (m1, m2, m3):
                await member.heartbeat()
        assert m3.owned
        await restore(r, "stale", "g", saved)

        # Everyone reports from its lost view, concurrently.
        shard_of_m3 = min(m3.owned)
        bodies = [
            (m1, m1.body(revoked={min(m2.owned)})),  # revoke of a shard m1 never held
            (m2, m2.body(revoked={shard_of_m3})),  # revoke of the shard it handed to m3
            (m3, m3.body(revoked={shard_of_m3})),  # a member Redis does not know
            (m2, m2.body(owned=set(), revoked=set(m2.owned))),
        ]
        responses = await asyncio.gather(*(member.post(body) for member, body in bodies))
        statuses = [resp.json()["status"] for resp in responses]
        assert statuses[2] == "UNKNOWN_MEMBER_ID"
        assert set(statuses) <= {"SYNC_METADATA", "UNKNOWN_MEMBER_ID"}
        after = await stored_group(r, "stale", "g")
        assert after["owners"] == before["owners"]
        assert after["target"] == before["target"]
        assert set(after["members"]) == {"m1", "m2"}
        assert after["correction"] is not None

        # Synced to Redis truth, only revokes matching Redis ownership apply.
        for member, response in zip((m1, m2), responses[:2], strict=True):
            member.epoch = response.json()["memberEpoch"]
            member.version = response.json()["metadataVersion"]
            member.owned &= set(shards(response.json()))
        m2_shards = sorted(int(s) for s, o in before["owners"].items() if o == "m2")
        sent = m2.version
        view = await m2.heartbeat(owned=m2_shards[:1], revoked=m2_shards[1:])
        _synced_answer(view, sent)
        sent = m1.version
        view = await m1.heartbeat(revoked={m2_shards[0]})  # not m1's: ignored, not fenced
        _synced_answer(view, sent)
        after = await stored_group(r, "stale", "g")
        expected = {s: o for s, o in before["owners"].items() if int(s) != m2_shards[1]}
        assert after["owners"] == expected


def _synced_answer(view: dict[str, Any], sent_version: int) -> None:
    """A synced member during a correction round is answered REVOKE_PENDING,
    unless another member's change moved Redis past the version it sent (then
    it must sync again, to a higher version)."""
    if view["status"] == "SYNC_METADATA":
        assert view["metadataVersion"] > sent_version, view
    else:
        assert view["status"] == "REVOKE_PENDING", view


async def test_coordinator_that_saw_a_later_revision_opens_the_correction_round_itself(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    """No client reports a higher version, yet a grant Redis forgot may be in use:
    the process that wrote it notices the revision going back and blocks grants."""
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        await create_group(http, coordinator, "selfheal", "g", 4)
        saved = await snapshot(r, "selfheal", "g")  # no members yet
        m1 = SimMember(http, coordinator.url, "selfheal", "g", "m1")
        await m1.heartbeat()  # m1 joins and is granted every shard: this is what gets lost
        assert m1.owned == {0, 1, 2, 3}
        regressions = await metric(
            http, coordinator, "redis_stream_coord_metadata_regression_total"
        )
        await restore(r, "selfheal", "g", saved)

        m2 = SimMember(http, coordinator.url, "selfheal", "g", "m2")
        view = await m2.heartbeat()  # m2 knows nothing newer than Redis
        assert view["status"] != "OK"
        assert shards(view) == []  # m1 may still be reading: nothing is granted
        group = await stored_group(r, "selfheal", "g")
        assert group["correction"] is not None
        assert (
            await metric(http, coordinator, "redis_stream_coord_metadata_regression_total")
            > regressions
        )
