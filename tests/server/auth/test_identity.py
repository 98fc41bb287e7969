"""Member identity over real HTTP: forged and stale leaves, a second process.

A member that sends an ``incarnation`` is the only one that can leave or
heartbeat as itself: a leave without it (anyone who can reach the API) or
with an earlier start's token frees nothing, and a join from another process
is refused with ``409 MEMBER_ID_IN_USE`` while the member lives.
"""

from __future__ import annotations

import json

import httpx
import pytest

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import SimMember, create_group, meta_key, redis_of

pytestmark = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


async def _reading_member(
    http: httpx.AsyncClient, coord: CoordinatorProcess, prefix: str
) -> SimMember:
    await create_group(http, coord, prefix, "g", 4)
    member = SimMember(http, coord.url, prefix, "g", "m1", incarnation="start-2")
    await member.heartbeat()
    await member.heartbeat()
    assert member.owned == {0, 1, 2, 3} and member.last_status == "OK"
    return member


async def _stored(target: RedisTarget, prefix: str) -> str:
    async with redis_of(target) as redis:
        return json.dumps(await redis.hgetall(meta_key(prefix, "g")), sort_keys=True)


@pytest.mark.parametrize(
    "incarnation", [None, "start-1"], ids=["forged-without-incarnation", "stale-from-earlier-start"]
)
async def test_a_leave_from_someone_else_frees_nothing(
    coordinator: CoordinatorProcess, any_redis: RedisTarget, incarnation: str | None
) -> None:
    prefix = f"forged-{incarnation or 'none'}"
    async with httpx.AsyncClient(auth=coordinator.admin_auth) as http:
        member = await _reading_member(http, coordinator, prefix)
        before = await _stored(any_redis, prefix)
        other = SimMember(http, coordinator.url, prefix, "g", "m1", incarnation=incarnation)
        for _ in range(2):  # a duplicated leave changes nothing either
            answer = await other.heartbeat(epoch=-1, owned=[])
            assert answer["status"] == "FENCED_MEMBER_EPOCH"
        assert await _stored(any_redis, prefix) == before
        # The real member reads on, undisturbed, and can still leave itself.
        await member.heartbeat()
        assert member.owned == {0, 1, 2, 3} and member.last_status == "OK"
        left = await member.heartbeat(epoch=-1, owned=[])
        assert left["status"] == "OK" and left["memberEpoch"] == -1
        newcomer = SimMember(http, coordinator.url, prefix, "g", "m2", incarnation="x")
        await newcomer.heartbeat()
        assert newcomer.owned == {0, 1, 2, 3}


async def test_a_second_process_with_the_same_member_id_is_refused(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient(auth=coordinator.admin_auth) as http:
        member = await _reading_member(http, coordinator, "twin")
        twin = SimMember(http, coordinator.url, "twin", "g", "m1", incarnation="start-3")
        refused = await twin.post(twin.body())
        assert refused.status_code == 409, refused.text
        error = refused.json()
        assert error["errorCode"] == "MEMBER_ID_IN_USE"
        assert "m1" in error["message"] and error["status"] == "409"
        # A heartbeat claiming the member's epoch from the twin is fenced; the
        # member itself is untouched.
        fenced = await twin.heartbeat(epoch=member.epoch, owned=[], apply=False)
        assert fenced["status"] == "FENCED_MEMBER_EPOCH"
        await member.heartbeat()
        assert member.owned == {0, 1, 2, 3} and member.last_status == "OK"
