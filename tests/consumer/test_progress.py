"""The consumption progress a member reports: the latest acked entry of each
shard, exactly, whatever order the acks and dead letters of a batch came in."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamkit import Message
from streamkit.consumer.failure import FailurePolicy

from .support import Admin, InProcessApp, eventually, serving

standalone = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


@standalone
@pytest.mark.parametrize("ordered", [True, False])
async def test_last_acked_id_is_the_latest_entry_handled(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    ordered: bool,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    # An entry of the last batch fails and is dead-lettered: that batch's
    # flush carries acks of entries on both sides of the dead letter.
    values = [*(str(i) for i in range(23)), "bad", "23", "24"]
    ids = [await redis.xadd(f"{prefix}:0", {"n": n}) for n in values]
    app = make_app("progress")
    handled: list[str] = []

    @app.stream_listener(
        stream_prefix=prefix,
        group=group,
        ordered=ordered,
        batch_size=10,
        failure_policy=FailurePolicy(max_attempts=1),
    )
    async def handle(msg: Message) -> None:
        if msg.fields["n"] == "bad":
            raise ValueError("bad entry")
        if not ordered:
            await anyio.sleep(0.001 * (int(msg.fields["n"]) % 3))  # finish out of order
        handled.append(msg.fields["n"])
        await msg.ack()

    def latest() -> str | None:
        (member,) = app.members
        assert member.poller is not None
        (progress,) = member.poller.progress() or (None,)
        return progress.last_acked_id if progress is not None else None

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: len(handled) == 25, 10, "every good entry")
            await eventually(lambda: latest() == ids[-1].decode(), 10, "the last entry's id")
    assert await redis.xlen(f"{prefix}:0") == 26
