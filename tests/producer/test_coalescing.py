"""Concurrent publish() calls coalesced into pipelines: each caller its own
result and its own error, standalone and cluster; order within one task."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel
import redis.exceptions

from streamkit.publisher.coalescer import CommandCoalescer
from streamkit.publisher.publisher import PublishResult, StaleRouteError
from streamkit.routing import shard_for_key

from .conftest import Stack, gather


async def test_concurrent_publishes_get_their_own_results_and_errors(stack: Stack) -> None:
    pub = await stack.started_publisher(6)
    await stack.redis.delete(stack.key(1))  # retired behind the coordinator's back
    await stack.redis.delete(stack.key(2))
    await stack.redis.set(stack.key(2), "not a stream")  # every XADD to it fails
    keys = [f"user-{i}" for i in range(120)]
    outcomes = await gather(*[lambda k=k: pub.publish(k, {"k": k}) for k in keys])

    coalescer = pub.coalescer
    assert coalescer is not None and coalescer.pipelines >= 1  # calls did share pipelines
    for key, outcome in zip(keys, outcomes, strict=True):
        shard = shard_for_key(key, 6)
        if shard == 1:
            assert isinstance(outcome, StaleRouteError) and outcome.shard_index == 1
        elif shard == 2:
            assert isinstance(outcome, redis.exceptions.ResponseError)
            assert "WRONGTYPE" in str(outcome)
        else:
            assert isinstance(outcome, PublishResult) and outcome.shard_index == shard
            # The record id handed to this caller holds this caller's message.
            entries = await stack.redis.xrange(outcome.stream_key, outcome.record_id, "+", 1)
            assert entries[0][1] == {b"k": key.encode()}
    assert await stack.redis.exists(stack.key(1)) == 0  # never recreated
    assert pub.published == sum(isinstance(o, PublishResult) for o in outcomes)


async def test_calls_from_one_task_keep_their_order(stack: Stack) -> None:
    pub = await stack.started_publisher(2)

    async def writer(name: str) -> None:
        for seq in range(25):
            await pub.publish("same-key", {"w": name, "seq": seq})

    async with anyio.create_task_group() as tg:
        for w in range(8):
            tg.start_soon(writer, f"w{w}")
    entries = await stack.redis.xrange(stack.key(shard_for_key("same-key", 2)))
    assert len(entries) == 200
    seen: dict[bytes, list[int]] = {}
    for _, data in entries:
        seen.setdefault(data[b"w"], []).append(int(data[b"seq"]))
    assert all(seqs == list(range(25)) for seqs in seen.values()) and len(seen) == 8
    assert pub.coalescer is not None and pub.coalescer.pipelines >= 1


async def test_coalescing_off_sends_one_by_one(stack: Stack) -> None:
    await stack.create_group(2)
    pub = stack.publisher(coalesce=False)
    outcomes = await gather(*[lambda i=i: pub.publish(f"k{i}", {"i": i}) for i in range(10)])
    assert all(isinstance(o, PublishResult) for o in outcomes)
    assert pub.coalescer is None


# -- the coalescer alone, over an in-memory "server" ---------------------------------


class Echo:
    """Answers each command with its first argument after one event-loop turn;
    a command starting with "fail" is answered with an error reply."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def one(self, *command: Any) -> Any:
        self.batches.append(1)
        await anyio.sleep(0.005)
        return command[0]

    async def many(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        self.batches.append(len(commands))
        await anyio.lowlevel.checkpoint()
        return [ValueError(c[0]) if c[0].startswith("fail") else c[0] for c in commands]


async def test_batches_are_bounded_and_errors_stay_with_their_caller() -> None:
    echo = Echo()
    co = CommandCoalescer(echo.one, echo.many, max_batch=10)
    names = [("fail" if i % 7 == 3 else "ok") + str(i) for i in range(60)]
    outcomes = await gather(*[lambda n=n: co.execute(n) for n in names])
    for name, outcome in zip(names, outcomes, strict=True):
        if name.startswith("fail"):
            assert isinstance(outcome, ValueError) and str(outcome) == name
        else:
            assert outcome == name
    assert max(echo.batches) == 10 and sum(echo.batches) == 60 and co.sent == 60
    assert echo.batches[0] == 1  # the first call went out at once, alone


async def test_a_cancelled_leader_does_not_strand_its_batch() -> None:
    echo = Echo()
    co = CommandCoalescer(echo.one, echo.many, window=0.01)
    results: dict[str, Any] = {}
    leader_scope = anyio.CancelScope()

    async def call(name: str) -> None:
        results[name] = await co.execute(name)

    async def leader() -> None:
        with leader_scope:
            await call("leader")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first")  # in the air: the next caller leads a batch
        await anyio.lowlevel.checkpoint()
        tg.start_soon(leader)
        await anyio.lowlevel.checkpoint()
        tg.start_soon(call, "follower")  # joins the leader's batch
        await anyio.lowlevel.checkpoint()
        leader_scope.cancel()  # during the window: the batch still goes out
    assert results["follower"] == "follower" and results["first"] == "first"
    assert echo.batches == [1, 2]


async def test_a_cancelled_follower_leaves_the_others_answered() -> None:
    echo = Echo()
    co = CommandCoalescer(echo.one, echo.many, window=0.01)
    results: dict[str, Any] = {}
    follower_scope = anyio.CancelScope()

    async def call(name: str) -> None:
        results[name] = await co.execute(name)

    async def follower() -> None:
        with follower_scope:
            await call("gone")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first")
        await anyio.lowlevel.checkpoint()
        tg.start_soon(call, "leader")
        await anyio.lowlevel.checkpoint()
        tg.start_soon(follower)
        tg.start_soon(call, "stays")
        await anyio.lowlevel.checkpoint()
        follower_scope.cancel()  # its reply is dropped; the batch is still sent
    assert results == {"first": "first", "leader": "leader", "stays": "stays"}
    assert echo.batches == [1, 3]


class Slow:
    """Answers after 5 ms and records how many sends were in the air at once."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.in_air = 0
        self.most_in_air = 0

    async def _answer(self, size: int) -> None:
        self.batches.append(size)
        self.in_air += 1
        self.most_in_air = max(self.most_in_air, self.in_air)
        await anyio.sleep(0.005)
        self.in_air -= 1

    async def one(self, *command: Any) -> Any:
        await self._answer(1)
        return command[0]

    async def many(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        await self._answer(len(commands))
        return [c[0] for c in commands]


async def test_batches_gather_while_the_in_flight_limit_is_reached() -> None:
    slow = Slow()
    co = CommandCoalescer(slow.one, slow.many, max_in_flight=2, max_batch=1000)
    pauses = random.Random(3)

    async def caller(n: int) -> None:
        for i in range(10):  # callers arrive spread over time, as web requests do
            await anyio.sleep(pauses.uniform(0, 0.004))
            assert await co.execute(f"c{n}-{i}") == f"c{n}-{i}"

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(caller, n)
    assert sum(slow.batches) == 500 and co.sent == 500
    # Group commit: callers arriving while two sends are in the air wait and
    # join one batch. Without the limit every event-loop turn's arrivals went
    # out at once (here about 120 round trips, up to 13 connections at a time).
    assert slow.most_in_air <= 2
    assert len(slow.batches) <= 60


async def test_a_full_batch_does_not_wait_for_the_limit() -> None:
    slow = Slow()
    co = CommandCoalescer(slow.one, slow.many, max_in_flight=1, max_batch=5)
    outcomes = await gather(*[lambda i=i: co.execute(f"x{i}") for i in range(21)])
    assert outcomes == [f"x{i}" for i in range(21)]
    assert max(slow.batches) == 5 and sum(slow.batches) == 21
    assert slow.most_in_air > 1  # full batches went out beside the one in the air
