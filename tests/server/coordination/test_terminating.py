"""Terminating gate: in-flight critical sections finish, new ones get 503."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.api import create_app
from streamkit_server.settings import ServerSettings

from ..sim import SimMember, create_group, meta_key, redis_of

Factory = Callable[..., CoordinatorProcess]


async def _hold_mutex(target: RedisTarget, prefix: str) -> str:
    key = meta_key(prefix, "g").replace(":metadata", ":mutex")
    async with redis_of(target) as r:
        await r.set(key, "another-process", px=10_000)
    return key


async def _release(target: RedisTarget, key: str) -> None:
    async with redis_of(target) as r:
        await r.delete(key)


async def test_sigterm_lets_inflight_heartbeats_finish_and_refuses_new_ones(
    any_redis: RedisTarget, coordinator_factory: Factory
) -> None:
    # A lease far longer than the test: under load the in-flight heartbeat
    # may wait seconds behind the held mutex, and an expired m1 would be
    # fenced instead of answered OK.
    coord = coordinator_factory(
        any_redis,
        shutdown_grace_ms=3_000,
        member_lease_ttl_ms=30_000,
        rebalance_timeout_ms=30_000,
        env={"STREAMKIT_SERVER_MUTEX_WAIT_MS": "5000"},
    )
    async with httpx.AsyncClient(timeout=15) as http:
        await create_group(http, coord, "term", "g", 2)
        m1 = SimMember(http, coord.url, "term", "g", "m1")
        await m1.heartbeat()
        # Another process "holds" the group: our heartbeat waits inside its
        # critical section.
        mutex = await _hold_mutex(any_redis, "term")
        inflight = asyncio.create_task(m1.post(m1.body()))
        await asyncio.sleep(0.3)
        coord.signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        m2 = SimMember(http, coord.url, "term", "g", "m2")
        refused = await m2.post(m2.body())
        assert refused.status_code == 503
        assert refused.json()["errorCode"] == "COORDINATOR_TERMINATING"
        assert refused.json()["status"] == "503"
        assert (await http.get(f"{coord.url}/healthz")).status_code == 503
        assert not inflight.done()
        await _release(any_redis, mutex)
        finished = await inflight
        assert finished.status_code == 200 and finished.json()["status"] == "OK"
        assert coord.wait(20) == 0


async def test_gate_in_process(any_redis: RedisTarget) -> None:
    settings = ServerSettings(
        redis_url=any_redis.url,
        redis_cluster=any_redis.cluster,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=30_000,  # as above: no expiry while the heartbeat waits
        rebalance_timeout_ms=30_000,
        mutex_wait_ms=5000,
    )
    app = create_app(settings, admin_password="pw", token_secret=b"s")
    runtime = app.state.runtime
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://coord") as http:
            response = await http.post(
                "/coord/v1/streams/gate/groups/g", json={"requestedBy": "t"}, auth=("admin", "pw")
            )
            assert response.status_code == 201
            m1 = SimMember(http, "http://coord", "gate", "g", "m1", auth=("admin", "pw"))
            mutex = await _hold_mutex(any_redis, "gate")
            inflight = asyncio.create_task(m1.post(m1.body()))
            for _ in range(200):  # the heartbeat enters the gate, then waits on the mutex
                if runtime.gate.inside == 1:
                    break
                await asyncio.sleep(0.05)
            assert runtime.gate.inside == 1
            runtime.begin_terminating()
            m2 = SimMember(http, "http://coord", "gate", "g", "m2", auth=("admin", "pw"))
            refused = await m2.post(m2.body())
            assert refused.status_code == 503
            assert refused.json()["errorCode"] == "COORDINATOR_TERMINATING"
            mutation = await http.request(
                "DELETE", "/coord/v1/streams/gate/groups/g",
                json={"requestedBy": "t", "reason": "r"}, auth=("admin", "pw"),
            )  # fmt: skip
            assert mutation.status_code == 503
            # Reads still work while terminating.
            read = await http.get("/coord/v1/streams/gate/groups/g", auth=("admin", "pw"))
            assert read.status_code == 200
            await _release(any_redis, mutex)
            assert (await inflight).json()["status"] == "OK"
            assert await runtime.gate.wait_idle(1.0)
