"""Handler failures against real Redis and a real coordinator: retries counted by
Redis' delivery counter, dead letters, halted shards, unordered listeners, nack
delays and "do not retry" errors, a stop or a kill in the middle of a backoff."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from streamkit import Message, StreamKit
from streamkit.consumer.failure import FailurePolicy, dead_letter_key

from .support import (
    Admin,
    InProcessApp,
    all_acked,
    dead_letters,
    eventually,
    logical,
    nothing_pending,
    pending,
    serving,
    text,
)


class Poison(RuntimeError):
    pass


class Unfixable(ValueError):
    pass


@dataclass(frozen=True)
class Call:
    shard: int
    id: str
    key: str
    attempt: int
    at: float


async def publish(redis: Any, prefix: str, shard: int, key: str, **extra: str) -> str:
    entry: bytes = await redis.xadd(f"{prefix}:{shard}", {"key": key, **extra})
    return entry.decode()


async def test_poison_entry_in_ordered_shard_is_retried_then_dead_lettered(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    ids: dict[int, list[str]] = {0: [], 1: []}
    for n in range(6):
        for shard in (0, 1):
            ids[shard].append(await publish(redis, prefix, shard, f"k{shard}", n=str(n)))
    poison = await publish(redis, prefix, 0, "k0", n="poison", poison="1")
    for n in range(6, 10):
        for shard in (0, 1):
            ids[shard].append(await publish(redis, prefix, shard, f"k{shard}", n=str(n)))
    calls: list[Call] = []
    policy = FailurePolicy(max_attempts=4, backoff_initial_ms=40, jitter=0.0)

    app = make_app("poison")

    @app.stream_listener(stream_prefix=prefix, group=group, batch_size=5, failure_policy=policy)
    async def handle(msg: Message) -> None:
        calls.append(Call(msg.shard, msg.id, msg.fields["key"], msg.attempt, time.monotonic()))
        if "poison" in msg.fields:
            raise Poison(f"cannot handle {msg.fields['n']}")
        await msg.ack()

    dlq = dead_letter_key(prefix, group)
    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: _len(redis, dlq, 1), 10, "the poison entry dead-lettered")
            await eventually(
                lambda: sum(not c.key == "k0" or c.id != poison for c in calls) == 20,
                10,
                "every other entry",
            )
            await eventually(lambda: nothing_pending(redis, prefix, group, 2), 5, "all acked")
    # Ids are per stream: shard 1 may have an entry with the poison's id.
    tries = [c for c in calls if c.shard == 0 and c.id == poison]
    assert [c.attempt for c in tries] == [1, 2, 3, 4]
    gaps = [b.at - a.at for a, b in itertools.pairwise(tries)]
    # No jitter: each wait is at least the policy's delay, and they double.
    for gap, delay_ms in zip(gaps, (40, 80, 160), strict=True):
        assert gap >= delay_ms / 1000 * 0.95, gaps
    (letter,) = await dead_letters(redis, dlq)
    assert letter["key"] == "k0" and letter["n"] == "poison" and letter["poison"] == "1"
    assert letter["x-original-stream"] == f"{prefix}:0"
    assert letter["x-original-id"] == poison
    assert letter["x-group"] == group
    assert letter["x-attempts"] == "4"
    assert letter["x-error"] == "Poison: cannot handle poison"
    assert abs(int(letter["x-failed-at"]) / 1000 - time.time()) < 60
    for shard in (0, 1):
        handled = [c.id for c in calls if c.shard == shard and c not in tries]
        assert handled == ids[shard]  # exactly once each, in stream (= per-key) order
    # Ordered: the entries after the poison waited for its last attempt.
    last_try = calls.index(tries[-1])
    after = {i for i in ids[0] if _id(i) > _id(poison)}
    assert all(calls.index(c) > last_try for c in calls if c.shard == 0 and c.id in after)


async def test_halt_mode_stops_only_that_shard(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    before = [await publish(redis, prefix, 0, "k0", n=str(n)) for n in range(3)]
    poison = await publish(redis, prefix, 0, "k0", poison="1")
    held_back = [await publish(redis, prefix, 0, "k0", n=str(n)) for n in range(3)]
    healthy = [await publish(redis, prefix, 1, "k1", n=str(n)) for n in range(5)]
    seen: list[tuple[int, str, int]] = []
    policy = FailurePolicy(max_attempts=2, backoff_initial_ms=20, on_exhausted="halt")

    app = make_app("halt")

    @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy)
    async def handle(msg: Message) -> None:
        seen.append((msg.shard, msg.id, msg.attempt))
        if "poison" in msg.fields:
            raise Poison("stop here")
        await msg.ack()

    def halted() -> dict[int, str]:
        return {s: e for m in app.members if m.poller for s, e in m.poller.halted.items()}

    def ids(shard: int) -> list[str]:
        return [i for s, i, _ in seen if s == shard]

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: halted() == {0: poison}, 10, "shard 0 halted")
            await eventually(lambda: ids(1) == healthy, 10, "shard 1 handled")
            # The other shard keeps going after the halt.
            later = await publish(redis, prefix, 1, "k1", n="later")
            await eventually(lambda: ids(1) == [*healthy, later], 10, "shard 1 read on")
            await anyio.sleep(0.3)  # shard 0 would have gone on by now
            assert ids(0) == [*before, poison, poison]
    assert [a for s, i, a in seen if (s, i) == (0, poison)] == [1, 2]
    assert await redis.exists(dead_letter_key(prefix, group)) == 0
    # Still pending for the next owner, with its delivery count; the entries
    # read with it in its batch wait behind it, never handled.
    first, *rest = await redis.xpending_range(f"{prefix}:0", group, "-", "+", 10)
    assert text(first["message_id"]) == poison and first["times_delivered"] == 2
    assert [text(e["message_id"]) for e in rest] == held_back


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_unordered_listener_does_not_wait_for_a_failing_entry(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    poison = await publish(redis, prefix, 0, "k", poison="1")
    others = [await publish(redis, prefix, 0, "k", n=str(n)) for n in range(300)]
    seen: list[tuple[str, int]] = []
    policy = FailurePolicy(max_attempts=2, backoff_initial_ms=1_500, jitter=0.0)

    app = make_app("unordered")

    @app.stream_listener(
        stream_prefix=prefix, group=group, ordered=False, batch_size=50, failure_policy=policy
    )
    async def handle(msg: Message) -> None:
        seen.append((msg.id, msg.attempt))
        if "poison" in msg.fields:
            raise Poison("later, maybe")
        await msg.ack()

    dlq = dead_letter_key(prefix, group)
    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: _len(redis, dlq, 1), 10, "the poison entry dead-lettered")
            await eventually(lambda: nothing_pending(redis, prefix, group, 1), 5, "all acked")
    assert [a for i, a in seen if i == poison] == [1, 2]
    # Every other entry was handled once, before the retry of the poison.
    first_retry = seen.index((poison, 2))
    assert sorted((i for i, _ in seen[:first_retry] if i != poison), key=_id) == others
    assert len(seen) == len(others) + 2


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_nack_delay_and_errors_that_are_not_retried(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    nacked = await publish(redis, prefix, 0, "k", do="nack")
    unfixable = await publish(redis, prefix, 0, "k", do="unfixable")
    by_predicate = await publish(redis, prefix, 0, "k", do="predicate")
    after = await publish(redis, prefix, 0, "k", do="ack")
    seen: list[tuple[str, int, float]] = []
    policy = FailurePolicy(
        max_attempts=5,
        backoff_initial_ms=10,
        no_retry=(Unfixable,),
        no_retry_if=lambda exc: "permanent" in str(exc),
    )

    app = make_app("nack")

    @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy)
    async def handle(msg: Message) -> None:
        seen.append((msg.id, msg.attempt, time.monotonic()))
        do = msg.fields["do"]
        if do == "nack" and msg.attempt == 1:
            await msg.nack(delay=0.3)
        elif do == "unfixable":
            raise Unfixable("bad data")
        elif do == "predicate":
            raise RuntimeError("permanent failure")
        else:
            await msg.ack()

    dlq = dead_letter_key(prefix, group)
    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: _len(redis, dlq, 2), 10, "two dead letters")
            await eventually(lambda: any(s[0] == after for s in seen), 10, "the last entry")
            await eventually(lambda: nothing_pending(redis, prefix, group, 1), 5, "all acked")
    nacks = [s for s in seen if s[0] == nacked]
    assert [a for _, a, _ in nacks] == [1, 2]
    assert nacks[1][2] - nacks[0][2] >= 0.3 * 0.95
    letters = {d["x-original-id"]: d for d in await dead_letters(redis, dlq)}
    assert set(letters) == {unfixable, by_predicate}
    assert letters[unfixable]["x-attempts"] == "1"
    assert letters[unfixable]["x-error"] == "Unfixable: bad data"
    assert letters[by_predicate]["x-error"] == "RuntimeError: permanent failure"
    assert [s[0] for s in seen] == [nacked, nacked, unfixable, by_predicate, after]


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_a_stop_during_backoff_leaves_the_entry_to_the_next_owner(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    """A graceful stop does not wait for a 30 s backoff; the next member
    continues the attempt count from Redis' delivery counter."""
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    poison = await publish(redis, prefix, 0, "k", poison="1")
    after = await publish(redis, prefix, 0, "k", n="after")
    seen: list[tuple[str, int, str]] = []

    def make(base: str, policy: FailurePolicy) -> StreamKit:
        app = make_app(base)

        @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy)
        async def handle(msg: Message) -> None:
            seen.append((msg.id, msg.attempt, msg.member_id))
            if "poison" in msg.fields:
                raise Poison("again")
            await msg.ack()

        return app

    first = make("first", FailurePolicy(max_attempts=3, backoff_initial_ms=30_000))
    with anyio.fail_after(10):
        async with serving(first):
            await eventually(lambda: len(seen) == 1, 5, "the first attempt")
            stop_at = time.monotonic()
    assert time.monotonic() - stop_at < 5  # far less than the backoff
    assert await pending(redis, f"{prefix}:0", group) == 2
    second = make("second", FailurePolicy(max_attempts=3, backoff_initial_ms=10))
    dlq = dead_letter_key(prefix, group)
    with anyio.fail_after(15):
        async with serving(second):
            await eventually(lambda: _len(redis, dlq, 1), 10, "the poison entry dead-lettered")
            await eventually(lambda: nothing_pending(redis, prefix, group, 1), 5, "all acked")
    seen = [(i, a, logical(m)) for i, a, m in seen]  # without the per-start part
    assert [(a, m) for i, a, m in seen if i == poison] == [
        (1, "first-m0"),
        (2, "second-m0"),  # the claim is the second delivery
        (3, "second-m0"),
    ]
    assert [m for i, _, m in seen if i == after] == ["second-m0"]
    (letter,) = await dead_letters(redis, dlq)
    assert letter["x-attempts"] == "3"


def calls(path: Path) -> list[tuple[str, str, int]]:
    """(stream key/id, member, attempt) per handler call, in order."""
    out: list[tuple[str, str, int]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        _, entry, member, attempt = line.split()
        out.append((entry, member, int(attempt)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_owner_killed_mid_retry_next_owner_continues_the_count(
    admin: Admin, redis: Any, names: tuple[str, str], app_process: Any
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    key = f"{prefix}:0"
    entries: dict[int, list[str]] = {0: [], 1: []}
    for n in range(20):
        for shard in (0, 1):
            entry = await redis.xadd(f"{prefix}:{shard}", {"n": str(n)})
            entries[shard].append(f"{prefix}:{shard}/{entry.decode()}")
        if n == 5:
            poison = f"{key}/{(await redis.xadd(key, {'poison': '1'})).decode()}"
    # A retries after 100 ms, then waits 2 s: it is killed in that wait.
    a = app_process("a", prefix, group, module="failing", max_attempts=4, backoff_ms=100,
                    multiplier=20)  # fmt: skip

    def attempts(path: Path) -> list[int]:
        return [n for entry, _, n in calls(path) if entry == poison]

    await eventually(lambda: attempts(a.record) == [1, 2], 20, "two attempts on app A")
    a.kill()
    b = app_process("b", prefix, group, module="failing", max_attempts=4, backoff_ms=50,
                    multiplier=1)  # fmt: skip
    dlq = dead_letter_key(prefix, group)

    async def dead_lettered() -> bool:
        return int(await redis.xlen(dlq)) == 1

    await eventually(dead_lettered, 20, "the poison entry dead-lettered by B")
    await eventually(lambda: all_acked(redis, prefix, group, 2), 10, "everything acked")
    assert await b.terminate() == 0
    # B continued the count: its claim was the third delivery.
    assert attempts(b.record) == [3, 4]
    ((_, fields),) = await redis.xrange(dlq)
    assert fields[b"x-attempts"] == b"4" and fields[b"x-original-id"].decode() in poison
    handled = calls(a.record) + calls(b.record)
    for shard in (0, 1):
        seen = [e for e, _, _ in handled if e in set(entries[shard])]
        # Nothing lost; what A handled but could not ack came again (counted).
        assert set(seen) == set(entries[shard])
        duplicates = len(seen) - len(set(seen))
        print(f"shard {shard}: {duplicates} duplicate deliveries after the kill")
        # Per key (= per shard here) order, within each owner's deliveries.
        for path in (a.record, b.record):
            own = [e for e, _, _ in calls(path) if e in set(entries[shard])]
            firsts = list(dict.fromkeys(own))
            assert firsts == sorted(firsts, key=entries[shard].index)
    # Ordered: B handled the entries behind the poison only after dead-lettering it.
    b_calls = [e for e, _, _ in calls(b.record)]
    after = set(entries[0][6:])
    last_try = max(i for i, e in enumerate(b_calls) if e == poison)
    assert all(i > last_try for i, e in enumerate(b_calls) if e in after)


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


async def _len(redis: Any, key: str, count: int) -> bool:
    return int(await redis.xlen(key)) == count
