"""Coordinator processes sharing a Redis agree on their timings, or the newcomer is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.core import CoordinatorConfig
from streamkit_server.timings import LIVE_MS, coordinators_key, differences, encode

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


def test_the_same_timings_start_and_a_stopped_process_frees_the_choice(
    private_redis_server: RedisServer, first: Callable[..., CoordinatorProcess]
) -> None:
    one, two = first(), first()  # same timings: both serve
    assert one.is_running() and two.is_running()
    assert len(_entries(private_redis_server)) == 2
    one.stop()
    two.stop()
    # Both removed their entries on the way out: other timings may start now.
    assert _entries(private_redis_server) == {}
    changed = first(member_lease_ttl_ms=3_000)
    assert changed.is_running()
    (value,) = _entries(private_redis_server).values()
    assert "memberLeaseTtlMs=3000" in value


def test_an_entry_not_refreshed_for_the_live_window_belongs_to_a_gone_process(
    private_redis_server: RedisServer, first: Callable[..., CoordinatorProcess]
) -> None:
    client = redis.Redis.from_url(private_redis_server.url, decode_responses=True)
    try:
        stale = encode(CoordinatorConfig(member_lease_ttl_ms=60_000))
        now_ms = int(client.time()[0]) * 1000
        # A crashed process' entry, last seen just over the window ago.
        client.hset(KEY, "coord-crashed", f"{now_ms - LIVE_MS - 1000}|{stale}")
        started = first()
        assert started.is_running()
        assert "coord-crashed" not in client.hgetall(KEY)
        # Seen within the window: it counts, and other timings are refused.
        client.hset(KEY, "coord-alive", f"{int(client.time()[0]) * 1000}|{stale}")
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
