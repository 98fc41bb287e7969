"""Over real HTTP: a member credential cannot make another principal's
member leave.  The member sends no incarnation, as the reference clients do;
the probe freed a member's shards this way with any MEMBER credential."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from helpers import create_group
from two_principals import API, A, B, start
from two_principals import heartbeat as _hb

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess


async def test_only_the_joining_principal_can_leave_a_member_without_incarnation(
    private_redis_server: RedisServer, coordinator_factory: Callable[..., CoordinatorProcess]
) -> None:
    coord = start(private_redis_server, coordinator_factory)
    a, b = A, B
    group = f"{API}/streams/principals/groups/g"
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        await create_group(coord, "principals", "g", 2, http=http)
        url = f"{group}/members/ref-1/heartbeat"
        joined = (await http.post(url, json=_hb("ref-1", 0), auth=a)).json()
        epoch, version = joined["memberEpoch"], joined["metadataVersion"]
        owned = [s["shardIndex"] for s in joined["assignment"]["assignedShards"]]
        steady = await http.post(
            url,
            json=_hb("ref-1", epoch, metadataVersion=version,
                     ownedShards=[{"shardIndex": s} for s in owned]),
            auth=a,
        )  # fmt: skip
        assert steady.json()["status"] == "OK" and owned == [0, 1]

        forged = await http.post(url, json=_hb("ref-1", -1), auth=b)
        assert forged.status_code == 200
        assert forged.json()["status"] == "FENCED_MEMBER_EPOCH"
        members = await http.get(
            f"{API}/monitoring/streams/principals/groups/g/members", auth=coord.admin_auth
        )
        (member,) = members.json()["members"]
        assert member["state"] == "ACTIVE" and len(member["currentAssignment"]) == 2

        left = await http.post(url, json=_hb("ref-1", -1), auth=a)
        assert left.json()["status"] == "OK"
