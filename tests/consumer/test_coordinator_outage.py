"""The coordinator dies while members run: they read on within their lease,
stop when it runs out, and resume once a coordinator is back; nothing is lost."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest

from streamkit import Message, StreamKit
from streamkit.testing import RedisTarget, free_port

from .support import (
    Admin,
    MemoryRecorder,
    all_acked,
    eventually,
    in_process_settings,
    overlapping_reads,
    serving,
    settled_ownership,
)

pytestmark = pytest.mark.slow

SHARDS = 4
HEARTBEAT_MS = 200
LOCAL_LEASE_MS = 2 * HEARTBEAT_MS  # the member's default assignment lease
# Reads are timed client-side, so an end is observed a little after Redis
# ended the BLOCK; allow for event-loop lag on a busy CI machine.  Still far
# below the member lease TTL (1.5 s) after which the shards could move.
SLACK_NS = 300_000_000


async def test_members_ride_out_a_coordinator_outage(
    any_redis: RedisTarget, coordinator_factory: Any, redis: Any, names: tuple[str, str]
) -> None:
    prefix, group = names
    coordinator = coordinator_factory(any_redis, port=free_port())
    admin = Admin(coordinator)
    await admin.create_group(prefix, group, SHARDS)
    recorder = MemoryRecorder()
    app = StreamKit(read_observer=recorder, **in_process_settings(coordinator, any_redis, "steady"))
    handled: set[str] = set()
    published: set[str] = set()

    @app.stream_listener(stream_prefix=prefix, group=group, concurrency=2, batch_size=20)
    async def handle(msg: Message) -> None:
        handled.add(f"{msg.stream_key}/{msg.id}")
        await msg.ack()

    async def produce(stop: anyio.Event) -> None:
        i = 0
        while not stop.is_set():
            key = f"{prefix}:{i % SHARDS}"
            published.add(f"{key}/{(await redis.xadd(key, {'n': str(i)})).decode()}")
            i += 1
            await anyio.sleep(0.005)

    members = ["steady-m0", "steady-m1"]
    with anyio.fail_after(60):
        async with serving(app), anyio.create_task_group() as tg:
            await eventually(lambda: _settled(admin, prefix, group, members), 15, "shards spread")
            stop = anyio.Event()
            tg.start_soon(produce, stop)
            await anyio.sleep(0.5)

            # Kill right after every member renewed its lease: on a loaded
            # machine a late heartbeat can leave a member with almost no
            # lease at a random moment, and then nothing is read in the
            # outage for a reason this test is not about.
            await eventually(
                lambda: all(
                    m.machine.lease_remaining_ms(_now_ms()) > LOCAL_LEASE_MS // 2
                    for m in app.members
                ),
                10,
                "fresh leases",
                interval=0.002,
            )
            # Reads during the outage count from when the kill is asked for:
            # waiting for the process to be gone can take longer than the
            # 400 ms local lease on a loaded machine. The lease bound below
            # counts from when it is gone.
            kill_asked_ns = time.monotonic_ns()
            await anyio.to_thread.run_sync(coordinator.kill)
            killed_ns = time.monotonic_ns()
            # Past the local lease and past the coordinator's member lease TTL.
            await anyio.sleep(2.5)
            assert not any(m.machine.lease_valid(_now_ms()) for m in app.members)
            restarted_ns = time.monotonic_ns()
            await anyio.to_thread.run_sync(coordinator.start)

            await eventually(
                lambda: _settled(admin, prefix, group, members), 15, "shards back after restart"
            )
            await anyio.sleep(0.5)
            stop.set()
            await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 10, "all acked")

    reads = recorder.all_reads()
    during_outage = [r for r in reads if kill_asked_ns < r.start_ns < restarted_ns]
    assert during_outage, "members stopped reading at once instead of using their lease"
    for read in reads:
        if read.start_ns < restarted_ns:
            # Nothing read past the lease of the last heartbeat before the kill.
            assert read.end_ns <= killed_ns + LOCAL_LEASE_MS * 1_000_000 + SLACK_NS, read
    assert any(r.start_ns > restarted_ns for r in reads), "reading never resumed"
    assert not overlapping_reads(reads)
    assert published <= handled, len(published - handled)


async def _settled(admin: Admin, prefix: str, group: str, members: list[str]) -> bool:
    try:
        owners = await admin.owners(prefix, group)
    except httpx.TransportError:
        return False  # the coordinator is still coming back; any other error is real
    return settled_ownership(owners, members, SHARDS)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_short_outage_lapses_the_lease_without_a_fence(
    any_redis: RedisTarget,
    coordinator_factory: Any,
    redis: Any,
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Down longer than the local lease, shorter than the member lease TTL:
    reading pauses mid-batch, resumes on the next OK, and the entries skipped
    when the lease lapsed are delivered again (not left pending)."""
    prefix, group = names
    coordinator = coordinator_factory(any_redis, port=free_port(), member_lease_ttl_ms=8_000)
    admin = Admin(coordinator)
    await admin.create_group(prefix, group, 1)
    key = f"{prefix}:0"
    for i in range(300):
        await redis.xadd(key, {"n": str(i)})
    handled: list[tuple[str, bool]] = []
    app = StreamKit(**in_process_settings(coordinator, any_redis, "brief"))

    @app.stream_listener(stream_prefix=prefix, group=group, batch_size=100)
    async def handle(msg: Message) -> None:
        handled.append((msg.id, msg.redelivered))
        await anyio.sleep(0.01)  # a batch outlives the 400 ms local lease
        await msg.ack()

    with anyio.fail_after(40):
        async with serving(app):
            await eventually(lambda: len(handled) > 10, 10, "consuming")
            (member,) = app.members
            epoch = member.machine.epoch
            await anyio.to_thread.run_sync(coordinator.kill)
            await anyio.sleep(1.0)
            assert not member.machine.lease_valid(_now_ms())
            await anyio.to_thread.run_sync(coordinator.start)
            await eventually(lambda: all_acked(redis, prefix, group, 1), 20, "all acked")
            assert member.machine.epoch == epoch  # never fenced: same membership
    assert any(redelivered for _, redelivered in handled)
    assert {entry for entry, _ in handled} == {
        entry_id.decode() for entry_id, _ in await redis.xrange(key)
    }
    assert not any("FENCED" in r.getMessage() for r in caplog.records)
