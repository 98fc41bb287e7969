"""A shard whose consumer group vanished (NOGROUP) is retried with backoff,
never in a hot loop and never recreated by the member; other shards go on."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from streamkit import Message

from .support import Admin, InProcessApp, MemoryRecorder, eventually, serving


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_missing_group_backs_off_and_recovers(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    recorder = MemoryRecorder()
    handled: list[str] = []
    app = make_app("ng", read_observer=recorder)

    @app.stream_listener(stream_prefix=prefix, group=group, batch_size=10, max_in_flight=10)
    async def handle(msg: Message) -> None:
        handled.append(msg.stream_key)
        await msg.ack()

    caplog.set_level(logging.ERROR, logger="streamkit.poller")
    broken = f"{prefix}:1"
    with anyio.fail_after(30):
        async with serving(app):
            await redis.xadd(broken, {"n": "0"})
            await eventually(lambda: handled == [broken], 10, "first entry")
            await redis.xgroup_destroy(broken, group)
            await anyio.sleep(0.2)
            window_start = len(recorder.reads)
            # The healthy shard keeps flowing while shard 1 fails.
            for i in range(20):
                await redis.xadd(f"{prefix}:0", {"n": str(i)})
            await eventually(lambda: len(handled) == 21, 5, "shard 0 unaffected")
            await anyio.sleep(2.0)
            attempts = [r for r in recorder.reads[window_start:] if r.shard == 1]
            assert 2 <= len(attempts) <= 12, len(attempts)  # backoff, not a hot loop
            assert await redis.exists(broken)  # the member recreated nothing
            assert not [g for g in await redis.xinfo_groups(broken) if g["name"] == group.encode()]

            # The coordinator (here: the test) provisions the group again.
            await redis.xgroup_create(broken, group, "$")
            await redis.xadd(broken, {"n": "1"})
            await eventually(lambda: handled.count(broken) == 2, 10, "shard 1 reading again")
    assert any("is missing on" in r.getMessage() for r in caplog.records)
