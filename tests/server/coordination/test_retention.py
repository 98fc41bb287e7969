"""Retention with a real coordinator: a stalled group makes it wait, never drop.

The groups here read with plain ``XREADGROUP`` / ``XACK`` (what a streamkit
consumer sends), so the test decides exactly what each group has read,
acknowledged and left pending.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from helpers import Admin, eventually

from streamkit.routing import stream_key
from streamkit.testing import RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess

pytestmark = pytest.mark.anyio

_FAST = {"STREAMKIT_SERVER_RETENTION_INTERVAL_MS": "100"}


@pytest.fixture
def coordinator(any_redis: RedisTarget, coordinator_pool: Any) -> CoordinatorProcess:
    """The module's coordinator, with a janitor pass every 100 ms."""
    proc: CoordinatorProcess = coordinator_pool.get(any_redis, env=_FAST)
    return proc


async def _metric(admin: Admin, name: str, **labels: str) -> float | None:
    r = await admin.http_get_metrics()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in r.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == want:
            return float(match.group(2))
    return None


class _Admin(Admin):
    async def http_get_metrics(self) -> str:
        import httpx

        async with httpx.AsyncClient(timeout=15) as http:
            r = await http.get(f"{self.url}/metrics", auth=self.auth)
        assert r.status_code == 200, r.text
        return r.text


def _log(coordinator: CoordinatorProcess) -> str:
    path = coordinator.log_path
    return path.read_text(errors="replace") if path is not None and path.exists() else ""


async def test_a_stalled_group_blocks_retention_a_healthy_one_lets_it_trim(
    any_redis: RedisTarget, coordinator: CoordinatorProcess
) -> None:
    admin = _Admin(coordinator)
    await admin.create_stream("orders", 2, retention={"maxLength": 5})
    await admin.create_group("orders", "fast")
    client = redis_client(any_redis, decode_responses=True)
    keys = [stream_key("orders", s) for s in range(2)]

    async def lengths() -> list[int]:
        return [await client.xlen(k) for k in keys]

    async def read(group: str, key: str, count: int | None = None, ack: bool = True) -> list[str]:
        got = await client.xreadgroup(group, "c", {key: ">"}, count=count)
        ids = [i for _, entries in got for i, _ in entries]
        if ack and ids:
            await client.xack(key, group, *ids)
        return ids

    try:
        for key in keys:
            for n in range(20):
                await client.xadd(key, {"n": str(n)})

        def blocks_both(group: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                shards = await _metric(
                    admin, "redis_stream_coord_retention_blocked_shards",
                    stream_prefix="orders", consumer_group=group,
                )  # fmt: skip
                return shards == 2

            return check

        # Unread by 'fast': retention waits for it.
        fast_blocks_both = blocks_both("fast")
        await eventually(fast_blocks_both, what="'fast' reported as blocking both shards")
        assert await lengths() == [20, 20]
        # A healthy group's reads let retention trim (its last delivered entry is the newest).
        for key in keys:
            await read("fast", key)

        async def trimmed() -> bool:
            return await lengths() == [5, 5]

        await eventually(trimmed, what="both shards trimmed to maxLength")

        # A second group that stalls: one unacknowledged read on shard 0, none on shard 1.
        await admin.create_group("orders", "slow")
        for key in keys:
            for n in range(20, 40):
                await client.xadd(key, {"n": str(n)})
            await read("fast", key)
        pending = await read("slow", keys[0], count=3, ack=False)
        snapshot = {k: [i for i, _ in await client.xrange(k)] for k in keys}
        slow_blocks_both = blocks_both("slow")
        await eventually(slow_blocks_both, what="'slow' reported as blocking both shards")
        for _ in range(5):  # several more passes: still nothing it needs is gone
            await eventually(slow_blocks_both, what="another pass")
        for key in keys:
            assert [i for i, _ in await client.xrange(key)] == snapshot[key]
        assert set(pending) <= set(snapshot[keys[0]])
        blocked_s = await _metric(
            admin, "redis_stream_coord_retention_blocked_seconds",
            stream_prefix="orders", consumer_group="slow",
        )  # fmt: skip
        assert blocked_s is not None and blocked_s >= 0
        await eventually(
            lambda: (
                "retention blocked by group slow on shard 1 of stream orders" in _log(coordinator)
            ),
            what="the blocked log line",
        )

        # The stalled group catches up: retention goes on, down to the policy.
        await client.xack(keys[0], "slow", *pending)
        for key in keys:
            await read("slow", key)
        await eventually(trimmed, what="both shards trimmed once 'slow' caught up")
        assert not await slow_blocks_both()
        # The trimmed entries were read and acknowledged by both groups.
        for key in keys:
            assert [i for i, _ in await client.xrange(key)] == snapshot[key][-5:]
    finally:
        await client.aclose()


async def test_retention_is_set_read_and_validated(
    any_redis: RedisTarget, coordinator: CoordinatorProcess
) -> None:
    admin = Admin(coordinator)
    await admin.create_stream("audit", 1)
    body = await admin.get_json("/streams/audit/retention")
    assert body == {"streamPrefix": "audit", "retention": None, "effective": None,
                    "source": "none"}  # fmt: skip
    week = {"maxAgeMs": 604_800_000, "maxLength": None}
    r = await admin.request("PUT", "/streams/audit/retention", {"requestedBy": "t", **week})
    assert r.status_code == 200, r.text
    assert r.json()["retention"] == week and r.json()["effective"] == week
    assert (await admin.get_json("/streams/audit/retention"))["source"] == "stream"
    # A group created with a retention replaces the stream's.
    r = await admin.post(
        "/streams/audit/groups/g", {"requestedBy": "t", "retention": {"maxLength": 9}}
    )
    assert r.status_code == 201, r.text
    body = await admin.get_json("/streams/audit/retention")
    assert body["retention"] == {"maxAgeMs": None, "maxLength": 9}
    for bad in ({"maxAgeMs": 0}, {"maxLength": -1}, {"maxLength": "x"}):
        r = await admin.request("PUT", "/streams/audit/retention", {"requestedBy": "t", **bad})
        assert r.status_code == 400 and r.json()["errorCode"] == "INVALID_REQUEST", r.text
    r = await admin.request("PUT", "/streams/nope/retention", {"requestedBy": "t"})
    assert r.status_code == 404 and r.json()["errorCode"] == "STREAM_NOT_FOUND"


def _cli(coordinator: CoordinatorProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    user, password = coordinator.admin_auth
    env.update(
        STREAMKIT_COORDINATOR_URL=coordinator.url,
        STREAMKIT_COORDINATOR_USERNAME=user,
        STREAMKIT_COORDINATOR_PASSWORD=password,
    )
    return subprocess.run(
        [sys.executable, "-m", "streamkit", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_the_cli_sets_and_shows_retention(
    any_redis: RedisTarget, coordinator: CoordinatorProcess
) -> None:
    await Admin(coordinator).create_stream("clicks", 1)
    done = _cli(coordinator, "stream", "retention", "clicks", "--max-age", "7d",
                "--max-length", "1000000", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["retention"] == {"maxAgeMs": 604_800_000, "maxLength": 1_000_000}
    shown = _cli(coordinator, "stream", "retention", "clicks")
    assert shown.stdout.strip() == (
        "stream 'clicks': retention max age 7d, max length 1000000 (its own)"
    ), shown.stderr
    cleared = _cli(coordinator, "stream", "retention", "clicks", "--none")
    assert "retention none (its own)" in cleared.stdout, cleared.stderr
    missing = _cli(coordinator, "stream", "retention", "nope", "--max-age", "1h")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: ") and len(missing.stderr.splitlines()) == 1
    assert "STREAM_NOT_FOUND" in missing.stderr or "does not exist" in missing.stderr
