"""Redis at ``maxmemory`` with ``noeviction``: it refuses every write that
adds data.  What each part does then:

* a publisher gets the refusal at once, typed (``OutOfMemoryError``, no
  retries: waiting would not free memory) and nothing is appended twice or
  silently dropped; an idempotent publish too, and its id stays free for
  the caller's retry;
* a consumer keeps handling and acking what was already published (``XACK``
  and reads do not need memory), so it frees memory rather than using it;
* the coordinator answers ``503 REDIS_OUT_OF_MEMORY`` with ``Retry-After``
  (not a 500) to anything that must write, and changes nothing;
* everything resumes once memory is freed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio
import redis.exceptions
from helpers import join_body

from streamkit import Message, Publisher, StreamKit
from streamkit.testing import RedisCluster, RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from .support import Admin, eventually, in_process_settings, serving

pytestmark = pytest.mark.slow

PREFIX, GROUP = "full", "billing"


async def test_a_full_redis_refuses_publishes_clearly_and_consumers_drain(
    private_redis_server: RedisServer,
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    target = RedisTarget(private_redis_server.url, cluster=False)
    # Leases long enough to drain the backlog while every heartbeat is refused
    # (production's 30 s; the suite's default of 1.5 s would end them first).
    coordinator = coordinator_factory(
        target, heartbeat_interval_ms=500, member_lease_ttl_ms=20_000, rebalance_timeout_ms=20_000
    )
    await Admin(coordinator).create_group(PREFIX, GROUP, 2)
    r: Any = redis.asyncio.Redis.from_url(private_redis_server.url)
    app = StreamKit(**in_process_settings(coordinator, target, "full"))
    handled: list[str] = []
    gate = anyio.Event()

    @app.stream_listener(stream_prefix=PREFIX, group=GROUP, block_ms=100)
    async def handle(msg: Message) -> None:
        if msg.fields.get("n") != "first":
            await gate.wait()  # held until Redis is full
        handled.append(msg.id)
        await msg.ack()

    pub = Publisher(PREFIX, GROUP, settings=app.settings)
    try:
        async with serving(app):
            await pub.publish("k", {"n": "first"})
            await eventually(lambda: len(handled) == 1, 15, "the first entry handled")
            backlog = [await pub.publish(f"k{i}", {"n": i}) for i in range(100)]

            # Full: a limit below what is used (as after a burst of writes).
            await r.config_set("maxmemory-policy", "noeviction")
            await r.config_set("maxmemory", "1")
            retries = pub.retries
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                await pub.publish("x", {"pad": "x" * 512})
            assert pub.retries == retries  # refused at once, not retried
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                await pub.publish_many([(f"y{i}", {"i": i}) for i in range(5)])
            # An idempotent publish too: its script is refused at its first write.
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                await pub.publish("z", {"n": "z"}, idempotency_id="full-z")

            async with httpx.AsyncClient(
                base_url=coordinator.url, auth=coordinator.member_auth, timeout=10
            ) as http:
                answer = await http.post(
                    f"/coord/v1/streams/{PREFIX}/groups/{GROUP}/members/newcomer/heartbeat",
                    json=join_body("newcomer"),
                )
            assert answer.status_code == 503, answer.text
            assert answer.json()["errorCode"] == "REDIS_OUT_OF_MEMORY"
            assert answer.headers["retry-after"] == "1"

            # The consumer drains the backlog although Redis refuses writes.
            gate.set()
            await eventually(lambda: len(handled) >= 101, 20, "the backlog handled")
            assert {b.record_id for b in backlog} <= set(handled)
            for shard in range(2):
                await eventually(
                    lambda s=shard: _no_pending(r, s), 10, f"shard {shard} acked under OOM"
                )
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                await r.xadd(f"{PREFIX}:0", {"still": "full"})

            await r.config_set("maxmemory", "0")
            late = await pub.publish("after", {"n": "after"})
            await eventually(lambda: late.record_id in handled, 15, "handled after recovery")
            # The refused idempotent publish, sent again, appends once (the
            # refusal left no dedup record behind that would swallow it).
            again = await pub.publish("z", {"n": "z"}, idempotency_id="full-z")
            assert not again.deduplicated
            twice = await pub.publish("z", {"n": "z"}, idempotency_id="full-z")
            assert twice.deduplicated and twice.record_id == again.record_id
            await eventually(lambda: again.record_id in handled, 15, "the idempotent retry handled")
    finally:
        await pub.aclose()
        await r.aclose()


async def _no_pending(r: Any, shard: int) -> bool:
    return bool((await r.xpending(f"{PREFIX}:{shard}", GROUP))["pending"] == 0)


async def test_a_coordinator_on_a_full_cluster_answers_with_the_code(
    redis_cluster: RedisCluster,
    cluster_url: str,
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    """On a Redis Cluster the client reaches the full primary through its slot
    map; the refusal must still come back typed, as 503 REDIS_OUT_OF_MEMORY
    (not 500), and a write must work again once memory is freed."""
    coordinator = coordinator_factory(RedisTarget(cluster_url, cluster=True))
    admin = Admin(coordinator)
    await admin.create_group(PREFIX, GROUP, 2)
    primaries = redis_cluster.current_primaries()
    path = f"/coord/v1/streams/{PREFIX}/groups/{GROUP}/members/m1/heartbeat"
    join = join_body("m1")
    async with httpx.AsyncClient(
        base_url=coordinator.url, auth=coordinator.member_auth, timeout=10
    ) as http:
        try:
            for node in primaries:  # wherever the group's metadata lives
                with node.client() as conn:
                    conn.config_set("maxmemory-policy", "noeviction")
                    conn.config_set("maxmemory", "1")
            answer = await http.post(path, json=join)
            assert answer.status_code == 503, answer.text
            assert answer.json()["errorCode"] == "REDIS_OUT_OF_MEMORY"
            assert answer.headers["retry-after"] == "1"
            created = await admin.request(
                "POST",
                f"/streams/{PREFIX}/groups/other",
                {"initialShardCount": 1, "requestedBy": "t", "reason": "full"},
            )
            assert created.status_code == 503, created.text
            assert created.json()["errorCode"] == "REDIS_OUT_OF_MEMORY"
        finally:
            for node in primaries:
                with node.client() as conn:
                    conn.config_set("maxmemory", "0")
        answer = await http.post(path, json=join)
        assert answer.status_code == 200, answer.text
        assert answer.json()["memberEpoch"] > 0
