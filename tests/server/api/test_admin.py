"""Stream/group creation (provisioning), producer routing and deletion."""

from __future__ import annotations

import httpx

from streamkit.routing import redis_cluster_slot, stream_key
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import API, SimMember, create_group, meta_key, redis_of


async def test_create_stream_then_groups_provisions_every_shard(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http, \
            redis_of(any_redis) as r:  # fmt: skip
        created = await http.post(
            f"{API}/streams/orders", json={"initialShardCount": 3, "requestedBy": "t"}
        )
        assert created.status_code == 201
        assert created.json() == {"streamPrefix": "orders", "shardCount": 3, "metadataVersion": 1}
        for shard in range(3):  # empty shard streams, no consumer group yet
            assert await r.type(f"orders:{shard}") == "stream"
            assert await r.xlen(f"orders:{shard}") == 0
            assert await r.xinfo_groups(f"orders:{shard}") == []
        again = await http.post(f"{API}/streams/orders", json={"requestedBy": "t"})
        assert again.status_code == 409 and again.json()["errorCode"] == "STREAM_ALREADY_EXISTS"

        await r.xadd("orders:1", {"payload": "before the group"})
        group = await http.post(f"{API}/streams/orders/groups/billing", json={"requestedBy": "t"})
        assert group.status_code == 201
        assert group.json()["shardCount"] == 3 and group.json()["state"] == "EMPTY"
        for shard in range(3):
            (info,) = await r.xinfo_groups(f"orders:{shard}")
            assert info["name"] == "billing"
        # Created at 0: what producers published before the group is not skipped.
        (info,) = await r.xinfo_groups("orders:1")
        assert info["lag"] == 1

        dup = await http.post(f"{API}/streams/orders/groups/billing", json={"requestedBy": "t"})
        assert dup.status_code == 409 and dup.json()["errorCode"] == "GROUP_ALREADY_EXISTS"
        mismatch = await http.post(
            f"{API}/streams/orders/groups/other", json={"initialShardCount": 5, "requestedBy": "t"}
        )
        assert mismatch.status_code == 409
        assert mismatch.json()["errorCode"] == "SHARD_COUNT_MISMATCH"
        assert await r.exists(meta_key("orders", "other")) == 0

        routing = (await http.get(f"{API}/streams/orders/groups/billing/producer-routing")).json()
        assert routing["shardCount"] == 3 and routing["metadataVersion"] == 1
        assert routing["streamKeyPattern"] == "orders:{shardIndex}"
        for shard in routing["shards"]:
            key = f"orders:{shard['shardIndex']}"
            assert shard["streamKey"] == key
            assert shard["redisSlot"] == redis_cluster_slot(key)
            if any_redis.cluster:
                assert shard["redisSlot"] == await r.cluster_keyslot(key)


async def test_group_first_creates_the_stream_and_refuses_foreign_keys(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http, \
            redis_of(any_redis) as r:  # fmt: skip
        await r.xadd("taken:1", {"k": "v"})
        refused = await http.post(
            f"{API}/streams/taken/groups/g", json={"initialShardCount": 2, "requestedBy": "t"}
        )
        assert refused.status_code == 409 and refused.json()["errorCode"] == "STREAM_KEYS_EXIST"
        assert "taken:1" in refused.json()["message"]
        assert await r.exists("taken:0", meta_key("taken", "g")) == 0

        # What an interrupted create leaves behind (an empty shard with the
        # group) is adopted by the retry.
        await r.xgroup_create("resume:0", "g", id="0", mkstream=True)
        body = await create_group(http, coordinator, "resume", "g", 2)
        assert body["shardCount"] == 2
        for shard in range(2):
            assert [g["name"] for g in await r.xinfo_groups(f"resume:{shard}")] == ["g"]
        listed = (await http.get(f"{API}/monitoring/groups")).json()["groups"]
        assert [(g["streamPrefix"], g["consumerGroup"]) for g in listed] == [("resume", "g")]


async def test_delete_group(coordinator: CoordinatorProcess, any_redis: RedisTarget) -> None:
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http, \
            redis_of(any_redis) as r:  # fmt: skip
        await create_group(http, coordinator, "del", "g", 2)
        member = SimMember(http, coordinator.url, "del", "g", "m1")
        await member.heartbeat()
        url = f"{API}/streams/del/groups/g"
        request = {"requestedBy": "t", "reason": "cleanup"}
        busy = await http.request("DELETE", url, json=request)
        assert busy.status_code == 422 and busy.json()["errorCode"] == "GROUP_NOT_INACTIVE"
        forced = await http.request("DELETE", url, json={**request, "force": True})
        assert forced.status_code == 200 and forced.json()["consumerGroup"] == "g"
        assert await r.exists(meta_key("del", "g")) == 0
        # Its Redis consumer groups are gone from every shard stream too (a
        # leftover would block later drain proofs); the streams stay.
        for shard in (0, 1):
            key = stream_key("del", shard)
            assert await r.exists(key) == 1
            assert [g["name"] for g in await r.xinfo_groups(key)] == []
        assert (await http.get(url)).status_code == 404
        assert (await member.post(member.body())).status_code == 404
        assert (await http.get(f"{API}/monitoring/groups")).json()["groups"] == []
        gone = await http.request("DELETE", url, json=request)
        assert gone.status_code == 404
