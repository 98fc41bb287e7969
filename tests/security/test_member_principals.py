"""Over real HTTP: a member credential cannot make another principal's
member leave.  The member sends no incarnation, as the reference clients do;
the probe freed a member's shards this way with any MEMBER credential."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.auth.principals import hash_password

API = "/coord/v1"
PASSWORDS = {"svc-a": "pw-a-9f1c", "svc-b": "pw-b-2e7d"}


def _hb(member: str, epoch: int, **extra: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "requestId": "r", "memberId": member, "memberEpoch": epoch,
            "metadataVersion": 0, "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1},
            **extra}  # fmt: skip


async def test_only_the_joining_principal_can_leave_a_member_without_incarnation(
    private_redis_server: RedisServer, coordinator_factory: Callable[..., CoordinatorProcess]
) -> None:
    principals = [
        {"username": name, "passwordHash": hash_password(pw), "roles": ["MEMBER"]}
        for name, pw in PASSWORDS.items()
    ]
    coord = coordinator_factory(
        RedisTarget(private_redis_server.url, cluster=False),
        env={"STREAMKIT_SERVER_PRINCIPALS": json.dumps(principals)},
    )
    a, b = (("svc-a", PASSWORDS["svc-a"]), ("svc-b", PASSWORDS["svc-b"]))
    group = f"{API}/streams/principals/groups/g"
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        created = await http.post(
            group, json={"initialShardCount": 2, "requestedBy": "t", "reason": "t"},
            auth=coord.admin_auth,
        )  # fmt: skip
        assert created.status_code == 201, created.text
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
