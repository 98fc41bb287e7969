"""Coordinator processes sharing a Redis agree on their timings, or the newcomer is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
import redis
import redis.asyncio
from helpers import API, eventually

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.coordination.timings import (
    LIVE_MS,
    TimingConflict,
    Timings,
    coordinators_key,
    differences,
    encode,
)
from streamkit_server.core import CoordinatorConfig

from ..sim import SimMember, create_group, metric

KEY = coordinators_key("redis-stream:coord")
# CoordinatorProcess' default timings, as flags.
SAME = ["--heartbeat-interval-ms", "200", "--member-lease-ttl-ms", "1500",
        "--rebalance-timeout-ms", "3000"]  # fmt: skip


def _refused(redis_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run ``streamkit-server``, expecting it to refuse at start-up (a start times out)."""
    env = {**os.environ, "STREAMKIT_SERVER_ADMIN_PASSWORD": "pw",
           "STREAMKIT_SERVER_TOKEN_SECRET": "s", "STREAMKIT_SERVER_PORT": "0"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "streamkit_server", "--redis-url", redis_url, *flags],
        env=env, capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip


def _entries(server: RedisServer) -> dict[str, str]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        return {str(k): str(v) for k, v in client.hgetall(KEY).items()}
    finally:
        client.close()


@pytest.fixture
def first(private_redis_server: RedisServer) -> Iterator[Callable[..., CoordinatorProcess]]:
    procs: list[CoordinatorProcess] = []

    def start(**options: Any) -> CoordinatorProcess:
        proc = CoordinatorProcess(private_redis_server.url, **options).start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.cleanup()


def test_a_coordinator_with_other_timings_is_refused_with_one_line(
    private_redis_server: RedisServer, first: Callable[..., CoordinatorProcess]
) -> None:
    running = first()
    result = _refused(
        private_redis_server.url,
        *["--heartbeat-interval-ms", "200", "--member-lease-ttl-ms", "1000"],
        *["--rebalance-timeout-ms", "3000"],
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "STREAMKIT_SERVER_MEMBER_LEASE_TTL_MS is 1000 here and 1500 there" in lines[0]
    assert "HEARTBEAT_INTERVAL_MS" not in lines[0]  # only what differs is named
    assert running.is_running()
    # The refused process left no entry behind; the running one is still listed.
    assert len(_entries(private_redis_server)) == 1


def test_a_stopped_process_binds_its_timings_while_its_leases_may_run(
    private_redis_server: RedisServer, first: Callable[..., CoordinatorProcess]
) -> None:
    one, two = first(), first()  # same timings: both serve
    assert one.is_running() and two.is_running()
    assert len(_entries(private_redis_server)) == 2
    one.stop()
    two.stop()
    # Both stopped, but a member one of them answered may still read (and a
    # producer route for 30 s): a shorter lease would expire it sooner.
    entries = _entries(private_redis_server)
    assert len(entries) == 2 and all(v.endswith("|stopped") for v in entries.values())
    result = _refused(
        private_redis_server.url,
        *["--heartbeat-interval-ms", "200", "--member-lease-ttl-ms", "1000"],
        *["--rebalance-timeout-ms", "3000"],
    )
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert "stopped on this Redis with other timings" in line and "1000 here and 1500 there" in line
    # The same timings start at once.
    assert first().is_running()


async def test_other_timings_may_start_once_the_stopped_ones_leases_ran_out(
    private_redis_server: RedisServer,
) -> None:
    client = redis.asyncio.Redis.from_url(private_redis_server.url)
    short = CoordinatorConfig(
        heartbeat_interval_ms=100, member_lease_ttl_ms=300, producer_routing_lease_ms=400
    )
    other = CoordinatorConfig(heartbeat_interval_ms=100, member_lease_ttl_ms=250)
    try:
        old = Timings(client, "redis-stream:coord", "coord-old", short)
        new = Timings(client, "redis-stream:coord", "coord-new", other)
        await old.register()
        await old.mark_stopped()
        with pytest.raises(TimingConflict, match="may still run for up to 1 s"):
            await new.register()
        await anyio.sleep(0.5)  # the old process' routing lease (the longer one) ran out
        await new.register()
        assert set(await client.hgetall(KEY)) == {b"coord-new"}
    finally:
        await client.aclose()


def test_an_entry_past_its_binding_time_belongs_to_a_gone_process(
    private_redis_server: RedisServer, first: Callable[..., CoordinatorProcess]
) -> None:
    client = redis.Redis.from_url(private_redis_server.url, decode_responses=True)
    try:
        stale = encode(CoordinatorConfig(member_lease_ttl_ms=60_000))
        now_ms = int(client.time()[0]) * 1000
        # A crashed process' entry, bound until a second ago.
        client.hset(KEY, "coord-crashed", f"{now_ms - 1000}|{stale}")
        started = first()
        assert started.is_running()
        assert "coord-crashed" not in client.hgetall(KEY)
        # Refreshed a moment ago (bound for the live window): other timings are refused.
        client.hset(KEY, "coord-alive", f"{int(client.time()[0]) * 1000 + LIVE_MS}|{stale}")
    finally:
        client.close()
    result = _refused(private_redis_server.url, *SAME)
    assert result.returncode == 1
    assert "coord-alive" in result.stderr and "60000 there" in result.stderr


def test_differences_name_each_setting_that_differs() -> None:
    mine = encode(CoordinatorConfig())
    theirs = encode(CoordinatorConfig(heartbeat_interval_ms=1_000, producer_routing_lease_ms=5))
    text = differences(mine, theirs)
    assert "STREAMKIT_SERVER_HEARTBEAT_INTERVAL_MS is 3000 here and 1000 there" in text
    assert "STREAMKIT_SERVER_PRODUCER_ROUTING_LEASE_MS is 30000 here and 5 there" in text
    assert "MEMBER_LEASE" not in text and differences(mine, mine)


async def test_a_coordinator_that_finds_other_timings_registered_decides_nothing_until_gone(
    private_redis_server: RedisServer, first: Callable[..., CoordinatorProcess]
) -> None:
    """A process whose entry lapsed (it stalled) while one with other timings
    started: it suspends (503 on member calls and probes), and serves again
    once the other one's entry is gone."""
    coord = first()  # ticks every 100 ms
    client = redis.asyncio.Redis.from_url(private_redis_server.url, decode_responses=True)
    other = encode(CoordinatorConfig(member_lease_ttl_ms=60_000))
    async with httpx.AsyncClient(timeout=10) as http:
        await create_group(http, coord, "susp", "g", 2)
        member = SimMember(http, coord.url, "susp", "g", "m0")
        await member.heartbeat()

        async def answered(status: int) -> bool:
            nonlocal response
            response = await member.post(member.body())
            return response.status_code == status

        response: httpx.Response | None = None

        try:
            # Its entry lapses; another process with other timings registers.
            now_ms = int((await client.time())[0]) * 1000
            await client.delete(KEY)
            await client.hset(KEY, "coord-other", f"{now_ms + 60_000}|{other}")
            await eventually(lambda: answered(503), within=10, what="a suspended coordinator")
            assert response is not None
            assert response.json()["errorCode"] == "COORDINATOR_TIMINGS_CONFLICT"
            assert "memberLeaseTtlMs" not in response.text  # the settings' names, not the code's
            assert "MEMBER_LEASE_TTL_MS is 1500 here and 60000 there" in response.text
            health = await http.get(f"{coord.url}/healthz")
            assert health.status_code == 503 and health.json()["status"] == "SUSPENDED"
            assert (await http.get(f"{coord.url}/readyz")).status_code == 503
            path = f"{API}/monitoring/health"
            report = (await http.get(f"{coord.url}{path}", auth=coord.admin_auth)).json()
            assert report["status"] == "DOWN" and report["loop"] == "SUSPENDED"
            gauge = "redis_stream_coord_suspended"
            assert await metric(http, coord, gauge) == 1
            # The other process is gone: this one registers again and serves.
            await client.delete(KEY)
            await eventually(lambda: answered(200), within=10, what="the coordinator to serve")
            assert (await http.get(f"{coord.url}/healthz")).status_code == 200
            assert await metric(http, coord, gauge) == 0
            assert set(await client.hgetall(KEY)) == {coord.coordinator_id}
        finally:
            await client.aclose()
