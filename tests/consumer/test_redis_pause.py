"""Redis stops answering (SIGSTOP) while a member reads: no read outlives the
member's assignment lease, and a member whose local lease would outlive the
coordinator's is refused at its first answer."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio
import pytest

from streamkit import Message, StreamKit
from streamkit.consumer.runtime import AssignmentLeaseError
from streamkit.testing import RedisServer, RedisTarget

from .support import Admin, InProcessApp, MemoryRecorder, eventually, in_process_settings, serving

HEARTBEAT_MS = 200
LOCAL_LEASE_MS = 2 * HEARTBEAT_MS
# Event-loop lag on a busy machine; still far below the member lease TTL
# (1.5 s) after which the coordinator could hand the shard away.
SLACK_S = 0.5


async def test_no_read_outlives_the_lease_when_redis_stops_answering(
    private_redis_server: RedisServer, coordinator_factory: Any, names: tuple[str, str]
) -> None:
    prefix, group = names
    target = RedisTarget(url=private_redis_server.url, cluster=False)
    coordinator = coordinator_factory(target, heartbeat_interval_ms=HEARTBEAT_MS)
    await Admin(coordinator).create_group(prefix, group, 1)
    recorder = MemoryRecorder()
    app = StreamKit(read_observer=recorder, **in_process_settings(coordinator, target, "pause"))

    @app.stream_listener(stream_prefix=prefix, group=group, concurrency=1)
    async def handle(msg: Message) -> None:
        await msg.ack()

    pid = private_redis_server.pid
    assert pid is not None
    with anyio.fail_after(60):
        async with serving(app):
            await eventually(lambda: bool(app.members), 15, "the app started its member")
            member = app.members[0]
            await eventually(
                lambda: member.machine.may_read(0, time.monotonic_ns() // 1_000_000),
                15,
                "shard 0 assigned",
            )
            # Idle shard: the reader sits in a blocking XREADGROUP.
            await eventually(lambda: bool(recorder.open_reads()), 5, "a blocking read")
            os.kill(pid, signal.SIGSTOP)
            paused = time.monotonic()
            try:
                await anyio.sleep(LOCAL_LEASE_MS / 1000 + SLACK_S)
                # Heartbeats cannot succeed (the coordinator's Redis is paused
                # too), so the lease has run out: nothing may still be reading.
                assert not member.machine.lease_valid(time.monotonic_ns() // 1_000_000)
                still_open = recorder.open_reads()
                assert not still_open, f"reads open {time.monotonic() - paused:.2f}s after pause"
                ended_late = [
                    r for r in recorder.reads if r.end_ns / 1e9 > paused + LOCAL_LEASE_MS / 1000
                    + SLACK_S
                ]  # fmt: skip
                assert not ended_late
            finally:
                os.kill(pid, signal.SIGCONT)
            # And it recovers once Redis answers again.
            await eventually(
                lambda: member.machine.may_read(0, time.monotonic_ns() // 1_000_000),
                15,
                "reading again after Redis resumed",
            )


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)  # a settings check
async def test_a_local_lease_longer_than_the_coordinators_is_refused(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    # The launcher's member lease TTL is 1.5 s.
    app = make_app("long-lease", assignment_lease_ms=5_000)

    @app.stream_listener(stream_prefix=prefix, group=group)
    async def handle(msg: Message) -> None:
        await msg.ack()

    with anyio.fail_after(30), pytest.raises(BaseException) as refused:
        await app.serve()
    errors = [refused.value]
    while isinstance(errors[-1], BaseExceptionGroup):
        errors = list(errors[-1].exceptions)
    assert any(isinstance(e, AssignmentLeaseError) for e in errors), refused.value
    assert "STREAMKIT_ASSIGNMENT_LEASE_MS=5000" in str(errors[0])
    assert "1500" in str(errors[0])
