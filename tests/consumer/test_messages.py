"""Message settlement against real Redis: ack, ack_del, nack, handler errors,
auto_ack and sync handlers."""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import pytest

from streamkit import Message
from streamkit.consumer.failure import FailurePolicy, dead_letter_key

from .support import Admin, InProcessApp, eventually, logical, serving


async def add(redis: Any, key: str, do: str) -> str:
    entry: bytes = await redis.xadd(key, {"do": do})
    return entry.decode()


async def test_ack_ack_del_nack_and_failures(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    key = f"{prefix}:0"
    await admin.create_group(prefix, group, 1)
    ids = {do: [await add(redis, key, do) for _ in range(3)] for do in ("ack", "ack_del")}
    nacked = await add(redis, key, "nack")
    failing = await add(redis, key, "raise")
    after = await add(redis, key, "ack")
    calls: list[tuple[str, str, bool]] = []

    app = make_app("settle")

    policy = FailurePolicy(max_attempts=2, backoff_initial_ms=10)

    @app.stream_listener(stream_prefix=prefix, group=group, batch_size=4, failure_policy=policy)
    async def handle(msg: Message) -> None:
        do = msg.fields["do"]
        calls.append((do, msg.id, msg.redelivered))
        if do == "ack":
            await msg.ack()
        elif do == "ack_del":
            await msg.ack_del()
        elif do == "nack":
            # Give it back once; the redelivery acks it.
            await (msg.ack() if msg.redelivered else msg.nack())
        else:
            raise RuntimeError("boom")

    caplog.set_level(logging.WARNING, logger="streamkit.poller")
    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: any(c[1] == after for c in calls), 10, "the last entry")
            await eventually(lambda: ("nack", nacked, True) in calls, 10, "the nacked entry again")
            await eventually(lambda: _pending(redis, key, group, 0), 5, "nothing pending")
    assert [c for c in calls if c[1] == nacked] == [("nack", nacked, False), ("nack", nacked, True)]
    # A failing handler is retried by the policy, then dead-lettered (and acked).
    assert [c for c in calls if c[1] == failing] == [
        ("raise", failing, False),
        ("raise", failing, True),
    ]
    (letter,) = await redis.xrange(dead_letter_key(prefix, group))
    assert letter[1][b"x-original-id"].decode() == failing
    # ack_del removed its entries from the stream (XACK+XDEL in one MULTI on 7.x).
    remaining = {entry_id.decode() for entry_id, _ in await redis.xrange(key)}
    assert not remaining & set(ids["ack_del"])
    assert set(ids["ack"]) | {nacked, failing, after} <= remaining  # dead-lettered, not deleted
    failure = next(r for r in caplog.records if "handler failed" in r.getMessage())
    text = failure.getMessage()
    assert key in text and failing in text and "settle-m0" in logical(text)
    assert failure.exc_info is not None and "boom" in str(failure.exc_info[1])


async def _pending(redis: Any, key: str, group: str, count: int) -> bool:
    return int((await redis.xpending(key, group))["pending"]) == count


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_sync_handler_with_auto_ack_and_unordered_batches(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    key = f"{prefix}:0"
    await admin.create_group(prefix, group, 1)
    good = [await add(redis, key, "ok") for _ in range(20)]
    bad = await add(redis, key, "raise")
    policy = FailurePolicy(max_attempts=1)
    threads: set[int] = set()
    seen: list[str] = []

    app = make_app("sync")

    @app.stream_listener(
        stream_prefix=prefix, group=group, auto_ack=True, ordered=False, failure_policy=policy
    )
    def handle(msg: Message) -> None:  # plain def: runs in a worker thread
        threads.add(threading.get_ident())
        seen.append(msg.id)
        if msg.fields["do"] == "raise":
            raise ValueError("bad entry")

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: len(seen) == 21, 10, "every entry handled")
            await eventually(lambda: _pending(redis, key, group, 0), 5, "auto-acked")
    assert threading.get_ident() not in threads
    assert sorted(seen) == sorted([*good, bad])
    # One attempt only: the failed entry went straight to the dead-letter stream.
    (letter,) = await redis.xrange(dead_letter_key(prefix, group))
    assert letter[1][b"x-original-id"].decode() == bad
    assert letter[1][b"x-error"] == b"ValueError: bad entry"
