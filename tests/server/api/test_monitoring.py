"""Monitoring views over real HTTP and real Redis streams."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import API, SimMember, create_group, redis_of

MON = f"{API}/monitoring/streams/mon/groups/g"


async def test_monitoring_views(
    coordinator_factory: Callable[..., CoordinatorProcess], any_redis: RedisTarget
) -> None:
    # A lease far longer than the test: the members heartbeat once, and on a
    # loaded machine a 1.5 s lease could expire them before the views are read.
    coordinator = coordinator_factory(
        any_redis, member_lease_ttl_ms=20_000, rebalance_timeout_ms=40_000
    )
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http, \
            redis_of(any_redis) as r:  # fmt: skip
        await create_group(http, coordinator, "mon", "g", 2)
        m1 = SimMember(http, coordinator.url, "mon", "g", "m1")
        m2 = SimMember(http, coordinator.url, "mon", "g", "m2")
        await m1.heartbeat()
        await m2.heartbeat()
        ids = [await r.xadd("mon:0", {"payload": f"p{i}", "n": str(i)}) for i in range(5)]
        batch = await r.xreadgroup("g", "m1", {"mon:0": ">"}, count=2)
        delivered = batch[0][1][-1][0]
        body = m1.body()
        body["shardProgress"] = [
            {"shard": {"shardIndex": 0}, "streamKey": "mon:0", "lastDeliveredId": delivered,
             "lastAckedId": ids[0], "pendingCount": 1},
        ]  # fmt: skip
        assert (await m1.post(body)).status_code == 200

        group = (await http.get(MON)).json()
        assert group["state"] in {"RECONCILING", "ASSIGNING", "STABLE"}
        assert sum(group["targetAssignmentSummary"].values()) == 2
        assert group["activeMigration"] is None

        members = {v["memberId"]: v for v in (await http.get(f"{MON}/members")).json()["members"]}
        assert set(members) == {"m1", "m2"}
        assert members["m1"]["memberName"] == "m1" and members["m1"]["memberEpoch"] > 0
        assert "heartbeatAgeMs" in members["m1"]

        assignments = (await http.get(f"{MON}/assignments")).json()
        assert set(assignments["targetAssignment"]) == {"m1", "m2"}
        assert assignments["invariantViolations"] == []

        (row,) = (await http.get(f"{MON}/consumption")).json()["progress"]
        assert row["memberId"] == "m1" and row["lastDeliveredId"] == delivered
        assert row["pendingCount"] == 1 and row["memberState"] == "ACTIVE"

        offsets = (await http.get(f"{MON}/offsets")).json()
        shard0, shard1 = offsets["shards"]
        assert shard0["streamLength"] == 5 and shard0["pendingCount"] == 2 and shard0["lag"] == 3
        assert shard0["firstRecordId"] == ids[0] and shard0["lastRecordId"] == ids[-1]
        assert shard0["groupLastDeliveredId"] == delivered
        assert shard0["memoryUsageBytes"] > 0 and shard0["redisNodeEndpoint"]
        assert shard1["streamLength"] == 0 and shard1["lag"] == 0
        assert offsets["totalStreamLength"] == 5 and offsets["totalLag"] == 3
        assert offsets["memoryUsageKnown"] is True
        await r.delete("mon:1")  # a shard stream gone (retired or deleted by hand)
        gone = (await http.get(f"{MON}/offsets")).json()
        assert gone["shards"][1]["streamLength"] == 0 and gone["shards"][1]["lag"] is None
        assert gone["shards"][0]["lag"] == 3 and gone["totalLag"] is None
        assert gone["memoryUsageKnown"] is False

        page = (await http.get(f"{MON}/shards/0/messages", params={"limit": 2})).json()
        assert page["direction"] == "BACKWARD"
        assert [rec["recordId"] for rec in page["records"]] == [ids[4], ids[3]]
        assert page["records"][0]["payload"] == "p4" and page["records"][0]["fields"]["n"] == "4"
        seen = [rec["recordId"] for rec in page["records"]]
        while page["nextCursor"]:
            page = (
                await http.get(
                    f"{MON}/shards/0/messages", params={"limit": 2, "cursor": page["nextCursor"]}
                )
            ).json()
            seen += [rec["recordId"] for rec in page["records"]]
        assert seen == ids[::-1]
        forward = (
            await http.get(f"{MON}/shards/0/messages", params={"direction": "FORWARD", "limit": 3})
        ).json()
        assert [rec["recordId"] for rec in forward["records"]] == ids[:3]
        assert forward["nextCursor"] == ids[2]

        assert (await http.get(f"{MON}/migrations")).json() == {
            "migrations": [], "activeReshardingId": None,
        }  # fmt: skip
        health = (await http.get(f"{API}/monitoring/health")).json()
        assert health["status"] == "UP" and health["coordinatorId"].startswith("coord-")
        compat = (await http.get(f"{API}/monitoring/compatibility")).json()
        assert compat["supportedProtocolVersions"] == [1]
        assert compat["currentCoordinationVersion"] == 1
        assert compat["supportedCoordinationVersions"] == {"min": 1, "max": 1}
        assert compat["coordinationVersions"] == [{"version": 1, "lifecycle": "CURRENT"}]
        assert compat["metadataSchemaVersion"] == 1 and compat["metadataLayoutVersion"] == 2
        metrics = (await http.get("/metrics")).text
        assert "redis_stream_coord_heartbeats_total" in metrics


async def test_tick_expires_silent_members_without_any_heartbeat(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    import anyio

    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http:
        await create_group(http, coordinator, "mon", "g", 2)
        await SimMember(http, coordinator.url, "mon", "g", "m1").heartbeat()
        await anyio.sleep(2.0)  # > lease (1.5 s) + a few ticks, nobody heartbeats
        (member,) = (await http.get(f"{MON}/members")).json()["members"]
        assert member["state"] == "EXPIRED" and member["currentAssignment"] == []
        assert (await http.get(MON)).json()["state"] == "EMPTY"
