"""Revoke-before-assign handoff over real HTTP: lost responses and expiry (seed 000)."""

from __future__ import annotations

import time

import anyio
import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import SimMember, create_group, shards

LEASE_S = 1.5


def _decision(view: dict) -> tuple:
    return (
        view["status"],
        view["memberEpoch"],
        view["assignmentEpoch"],
        shards(view),
        shards(view, "pendingShards"),
    )


def _same_decision(a: dict, b: dict) -> None:
    assert _decision(a) == _decision(b)


async def _two_members(
    http: httpx.AsyncClient, coord: CoordinatorProcess, prefix: str
) -> tuple[SimMember, SimMember]:
    await create_group(http, coord, prefix, "g", 4)
    m1 = SimMember(http, coord.url, prefix, "g", "m1", auto_revoke=False)
    m2 = SimMember(http, coord.url, prefix, "g", "m2")
    await m1.heartbeat()
    assert m1.owned == {0, 1, 2, 3}
    await m1.heartbeat()
    await m2.heartbeat()  # join: target moves two shards, still held by m1
    assert m2.owned == set() and len(m2.pending) == 2
    return m1, m2


async def test_drain_response_lost_next_heartbeat_repeats_it(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http:
        m1, m2 = await _two_members(http, coordinator, "drain")
        lost = await m1.heartbeat(apply=False)  # the DRAIN decision, recorded in Redis
        assert sorted(shards(lost)) == sorted({0, 1, 2, 3} - m2.pending)
        again = await m1.heartbeat(apply=False)  # the same request, retried
        assert {**lost, "responseTo": None} == {**again, "responseTo": None}
        # Other members' heartbeats in between do not change m1's decision.
        await m2.heartbeat()
        assert m2.owned == set()
        _same_decision(lost, await m1.heartbeat())
        assert m1.draining == m2.pending


async def test_revoked_ack_response_lost_new_owner_gets_shard(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http:
        m1, m2 = await _two_members(http, coordinator, "ack")
        await m1.heartbeat()  # DRAIN
        moving = set(m1.draining)
        assert moving == m2.pending
        await m1.heartbeat(draining=moving)  # still draining: nothing moves
        await m2.heartbeat()
        assert m2.owned == set()
        await m1.heartbeat(revoked=moving, draining=(), apply=False)  # REVOKED, answer lost
        await m2.heartbeat()
        assert m2.owned == moving and m2.last_status == "OK"
        # m1's retry of the lost ack (old epoch, same report) is harmless.
        retry = await m1.heartbeat(revoked=moving, draining=())
        assert retry["status"] == "OK"
        assert set(shards(retry)).isdisjoint(moving)


async def test_previous_owner_expires_while_draining(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http:
        m1, m2 = await _two_members(http, coordinator, "expiry")
        sent = time.monotonic()
        await m1.heartbeat()  # DRAIN; then m1 goes silent while "draining"
        moving = set(m1.draining)
        granted_at = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await m2.heartbeat()
            if moving <= m2.owned:
                granted_at = time.monotonic()
                break
            assert m2.pending >= moving, "shards must stay pending until m1 expires"
            await anyio.sleep(0.1)
        assert granted_at is not None, "new owner never got the shards"
        assert granted_at - sent >= LEASE_S
        # m1 expired: everything is m2's now, and m1 is told to rejoin.
        await m2.heartbeat()
        assert m2.owned == {0, 1, 2, 3}
        stale = await m1.heartbeat()
        assert stale["status"] == "FENCED_MEMBER_EPOCH"
