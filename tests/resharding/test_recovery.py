"""Failures in the middle of a migration: a coordinator SIGKILLed in each state,
and a provisioning failure.  A new coordinator must finish from Redis alone."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from helpers import metadata_key

from streamkit.routing import redis_cluster_slot
from streamkit.testing import (
    AsyncRedisClient,
    RedisCluster,
    RedisServer,
    RedisTarget,
    free_port,
    redis_client,
)
from streamkit.testing.coordinator import CoordinatorProcess

from .proxy import HoldingProxy
from .support import COORDINATOR_ENV, Admin, SimConsumer, eventually

# A short mutex TTL: the dead coordinator's stream lock frees quickly.
ENV = {**COORDINATOR_ENV, "STREAMKIT_SERVER_MUTEX_TTL_MS": "1000"}
KP = "redis-stream:coord"

Factory = Callable[..., CoordinatorProcess]


async def restart(coordinator: CoordinatorProcess) -> None:
    """SIGKILL, then a new process on the same port (off the event loop)."""
    coordinator.kill()
    await anyio.to_thread.run_sync(coordinator.start)


@asynccontextmanager
async def running(*members: SimConsumer) -> AsyncIterator[anyio.Event]:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for member in members:
            tg.start_soon(member.run, stop)
        try:
            yield stop
        finally:
            stop.set()


async def _one_member(
    coordinator_factory: Factory,
    target: RedisTarget,
    http: httpx.AsyncClient,
    r: AsyncRedisClient,
    prefix: str,
) -> tuple[CoordinatorProcess, Admin, SimConsumer]:
    """A coordinator of this test's own (to kill), group g on 4 shards, member m."""
    coordinator = coordinator_factory(target, port=free_port(), env=ENV)
    admin = Admin(http, coordinator)
    await admin.create_group(prefix, "g", 4)
    return coordinator, admin, SimConsumer(http, coordinator, r, prefix, "g", "m")


async def test_killed_while_active(
    any_redis: RedisTarget,
    coordinator_factory: Factory,
    http: httpx.AsyncClient,
    r: AsyncRedisClient,
    prefix: str,
) -> None:
    coordinator, admin, member = await _one_member(coordinator_factory, any_redis, http, r, prefix)
    async with running(member):
        rid = await admin.scale_ok(prefix, 8)
        assert (await admin.migration(prefix, "g", rid))["state"] == "ACTIVE"
        await restart(coordinator)
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=15)
        entry = await r.xadd(f"{prefix}:7", {"n": "after"})

        async def read() -> bool:
            return f"{prefix}:7/{entry}" in member.handled

        await eventually(read, 10, "an entry of an added shard read")


async def test_killed_while_draining(
    any_redis: RedisTarget,
    coordinator_factory: Factory,
    http: httpx.AsyncClient,
    r: AsyncRedisClient,
    prefix: str,
) -> None:
    coordinator, admin, member = await _one_member(coordinator_factory, any_redis, http, r, prefix)
    member.skip.add(3)
    backlog = {f"{prefix}:3/{await r.xadd(f'{prefix}:3', {'n': str(i)})}" for i in range(5)}
    async with running(member):
        rid = await admin.scale_ok(prefix, 2)
        await admin.wait_state(prefix, ["g"], rid, "DRAINING", within=10)
        await restart(coordinator)
        assert await r.exists(f"{prefix}:3") == 1
        member.skip.clear()
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=15)
    assert backlog <= set(member.handled)
    assert await r.exists(f"{prefix}:2", f"{prefix}:3") == 0


async def _killed_while_preparing(
    admin: Admin,
    http: httpx.AsyncClient,
    prefix: str,
    held: Callable[[], Any],
    then_start: Callable[[], CoordinatorProcess],
    target: RedisTarget,
) -> None:
    """Scale 4 -> 8 while the coordinator cannot reach the new shard keys; kill
    it in PREPARING and check that a new coordinator finishes the job."""
    coordinator = admin.coordinator

    async def scale() -> None:
        with contextlib.suppress(httpx.HTTPError):
            await admin.scale(prefix, 8)

    async with anyio.create_task_group() as tg:
        tg.start_soon(scale)
        with anyio.fail_after(5):
            await held()
        listed = (await admin.get(f"/monitoring/streams/{prefix}/groups/g/migrations")).json()
        (migration,) = listed["migrations"]
        assert migration["state"] == "PREPARING"
        rid = migration["reshardingId"]
        assert (await admin.migration(prefix, "h", rid))["state"] == "PREPARING"
        assert (await admin.routing(prefix, "g"))["shardCount"] == 4  # nothing routed yet
        coordinator.kill()
    second = await anyio.to_thread.run_sync(then_start)
    admin = Admin(http, second)
    await admin.wait_state(prefix, ["g", "h"], rid, "DEPRECATED", within=15)
    assert (await admin.routing(prefix, "h"))["shardCount"] == 8
    client = redis_client(target, decode_responses=True)
    try:
        for shard in range(4, 8):
            groups = {g["name"] for g in await client.xinfo_groups(f"{prefix}:{shard}")}
            assert groups == {"g", "h"}
    finally:
        await client.aclose()


async def test_killed_while_preparing_standalone(
    redis_server: RedisServer,
    redis_url: str,
    coordinator_factory: Factory,
    http: httpx.AsyncClient,
    prefix: str,
) -> None:
    proxy = HoldingProxy(redis_server.port, tuple(f"{prefix}:{s}".encode() for s in range(4, 8)))
    proxy_port = await proxy.start()
    port = free_port()
    try:
        via_proxy = RedisTarget(f"redis://127.0.0.1:{proxy_port}/0", False)
        # From a thread: the proxy lives on this event loop and must keep going.
        first = await anyio.to_thread.run_sync(
            lambda: coordinator_factory(via_proxy, port=port, env=ENV)
        )
        admin = Admin(http, first)
        await admin.create_group(prefix, "g", 4)
        await admin.create_group(prefix, "h")
        target = RedisTarget(redis_url, False)
        await _killed_while_preparing(
            admin,
            http,
            prefix,
            proxy.holding.wait,
            lambda: coordinator_factory(target, port=port, env=ENV),
            target,
        )
    finally:
        await proxy.close()


def _slot_owners(cluster: RedisCluster) -> list[tuple[int, int, int]]:
    with cluster.nodes[0].client() as client:
        slots = client.execute_command("CLUSTER", "SLOTS")
    return [(lo, hi, int(node[1])) for lo, hi, node, *_ in slots]


async def test_killed_while_preparing_cluster(
    redis_cluster: RedisCluster,
    cluster_url: str,
    coordinator_factory: Factory,
    http: httpx.AsyncClient,
) -> None:
    owners = _slot_owners(redis_cluster)

    def node(key: str) -> int:
        slot = redis_cluster_slot(key)
        return next(port for lo, hi, port in owners if lo <= slot <= hi)

    # A prefix whose new shard key 4 lives on a node that none of the
    # coordinator's own keys (record, lock, group metadata, index) use: stopping
    # that node stalls provisioning and nothing else.
    for _ in range(1000):
        prefix = f"rs-{uuid.uuid4().hex[:8]}"
        stalled = node(f"{prefix}:4")
        own = [
            f"{KP}:{{{prefix}}}:stream", f"{KP}:groups",
            metadata_key(prefix, "g", KP), metadata_key(prefix, "h", KP),
        ]  # fmt: skip
        if all(node(key) != stalled for key in own):
            break
    else:
        pytest.fail("no suitable prefix found")
    (stopped,) = [n for n in redis_cluster.nodes if n.port == stalled]
    target = RedisTarget(cluster_url, True)
    port = free_port()
    first = coordinator_factory(target, port=port, env=ENV)
    admin = Admin(http, first)
    await admin.create_group(prefix, "g", 4)
    await admin.create_group(prefix, "h")
    pid = stopped.pid
    assert pid is not None
    try:
        # Stop the node first, then scale: the PREPARING writes (other nodes)
        # go through and provisioning hangs on the stopped one.
        os.kill(pid, signal.SIGSTOP)

        async def held() -> None:
            listed: dict[str, Any] = {"migrations": []}
            while not listed["migrations"]:
                listed = (
                    await admin.get(f"/monitoring/streams/{prefix}/groups/h/migrations")
                ).json()
                await anyio.sleep(0.02)

        def start_second() -> CoordinatorProcess:
            os.kill(pid, signal.SIGCONT)
            return coordinator_factory(target, port=port, env=ENV)

        await _killed_while_preparing(admin, http, prefix, held, start_second, target)
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_provisioning_failure_routes_nothing(
    redis_server: RedisServer,
    redis_url: str,
    coordinator_factory: Factory,
    http: httpx.AsyncClient,
    prefix: str,
) -> None:
    """The coordinator's Redis user may read every key but write only the
    current shard keys: provisioning the new ones fails with NOPERM."""
    user = f"limited-{prefix}"
    port = redis_server.port
    with redis_server.client() as control:
        control.execute_command(
            "ACL", "SETUSER", user, "reset", "on", ">pw", "+@all", "&*", "%R~*",
            f"~{KP}:*", *[f"~{prefix}:{s}" for s in range(4)],
        )  # fmt: skip
        try:
            limited = coordinator_factory(
                RedisTarget(f"redis://{user}:pw@127.0.0.1:{port}/0", False), env=ENV
            )
            admin = Admin(http, limited)
            await admin.create_group(prefix, "g", 4)
            await admin.create_group(prefix, "h")
            failed = await admin.scale(prefix, 6)
            assert failed.status_code == 503, failed.text
            error = failed.json()
            assert error["errorCode"] == "REDIS_STREAM_PROVISIONING_FAILED"
            assert "rolled back" in error["message"] and "no permissions" in error["message"]
            for group in ("g", "h"):
                listed = (
                    await admin.get(f"/monitoring/streams/{prefix}/groups/{group}/migrations")
                ).json()
                assert [m["state"] for m in listed["migrations"]] == ["ROLLED_BACK"]
                assert listed["activeReshardingId"] is None
                assert (await admin.routing(prefix, group))["shardCount"] == 4
            assert control.exists(f"{prefix}:4", f"{prefix}:5") == 0
            # Once Redis lets it, the same request goes through.
            control.execute_command("ACL", "SETUSER", user, "~*")
            rid = await admin.scale_ok(prefix, 6)
            await admin.wait_state(prefix, ["g", "h"], rid, "DEPRECATED", within=10)
        finally:
            control.execute_command("ACL", "DELUSER", user)
