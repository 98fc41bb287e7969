"""A Redis failover seen by the coordinator: its Redis URL leads to a node
that was demoted to a replica (found by the chaos soak, tests/chaos).

Before the fix every request answered 500 INTERNAL_ERROR, and the pooled
connections stayed on the replica after the endpoint moved to the new
primary, so the coordinator never recovered by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from chaos.proxy import ChaosProxy

from streamkit.testing import HOST, RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import create_group


async def test_a_demoted_primary_answers_503_then_the_coordinator_follows_the_endpoint(
    primary_and_replica: tuple[RedisServer, RedisServer],
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    primary, replica = primary_and_replica
    endpoint = ChaosProxy([replica.port])  # the endpoint points at the replica
    await endpoint.start()
    try:
        coordinator = coordinator_factory(
            RedisTarget(f"redis://{HOST}:{endpoint.port}/0", cluster=False), start=False
        )
        # In a thread: the proxy runs on this event loop and must keep serving.
        await asyncio.to_thread(coordinator.start)
        async with httpx.AsyncClient(auth=coordinator.admin_auth, timeout=10) as http:
            url = f"{coordinator.url}/coord/v1/streams/ro/groups/g"
            body = {"initialShardCount": 2, "requestedBy": "tests", "reason": "readonly"}
            refused = await http.post(url, json=body)
            assert refused.status_code == 503, refused.text
            assert refused.json()["errorCode"] == "REDIS_UNAVAILABLE"
            assert refused.headers["Retry-After"] == "1"

            # The failover completes: the endpoint now leads to the primary,
            # but open connections are left alone (as a DNS flip does).
            endpoint.switch([primary.port], cut=False)
            # A connection the tick loop opened to the replica before the
            # switch may still be pooled: the request that meets it answers
            # 503 and drops the pool, as a client retrying after Retry-After
            # sees. Within a few retries the coordinator writes to the primary.
            for _attempt in range(5):
                created = await http.post(url, json=body)
                if created.status_code != 503:
                    break
                assert created.json()["errorCode"] == "REDIS_UNAVAILABLE", created.text
            assert created.status_code == 201, created.text
            await create_group(http, coordinator, "ro2", "g", 2)
    finally:
        await endpoint.close()
