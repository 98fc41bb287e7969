"""The poller's fairness scheduling (``FairGate``), without Redis."""

from __future__ import annotations

from collections import Counter

import anyio
import anyio.lowlevel
import pytest

from streamkit.consumer.fair_gate import FairGate


async def test_shards_take_turns_when_tokens_are_scarce() -> None:
    # 8 shard loops, tokens for one batch at a time: grants must rotate.
    gate = FairGate(10)
    order: list[int] = []

    async def shard_loop(shard: int) -> None:
        for _ in range(10):
            granted = await gate.acquire(10)
            order.append(shard)
            await anyio.lowlevel.checkpoint()  # "handle the batch"
            gate.release(granted)

    async with anyio.create_task_group() as tg:
        for shard in range(8):
            tg.start_soon(shard_loop, shard)
    assert Counter(order) == {shard: 10 for shard in range(8)}
    # Round-robin: within any window of 8 consecutive grants every shard appears once.
    for start in range(0, len(order), 8):
        assert sorted(order[start : start + 8]) == list(range(8)), order


async def test_a_loop_that_just_finished_queues_behind_waiters() -> None:
    gate = FairGate(4)
    first = await gate.acquire(4)
    got: list[str] = []

    async def waiter(name: str) -> None:
        got.append(name + str(await gate.acquire(4)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "b")
        await anyio.sleep(0.01)
        assert gate.waiting == 1
        gate.release(first)
        # The releasing loop asks again at once: the waiter was served first.
        assert gate.try_acquire(4) == 0
    assert got == ["b4"]


async def test_partial_grants_keep_the_line_moving() -> None:
    gate = FairGate(10)
    assert await gate.acquire(4) == 4
    assert await gate.acquire(10) == 6  # what is free, not all it asked for
    assert gate.available == 0
    gate.release(10)
    assert gate.available == 10
    assert await gate.acquire(25) == 10  # never more than the whole budget


async def test_a_fragment_under_half_a_request_is_not_granted() -> None:
    # Tokens come back in the sizes they went out: a 10-token request that
    # took the 3 left over would read 3 entries now and stay small after.
    gate = FairGate(10)
    held = await gate.acquire(7)
    assert gate.try_acquire(10) == 0
    got: list[int] = []

    async def waiter() -> None:
        got.append(await gate.acquire(10))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.01)
        assert gate.waiting == 1 and gate.available == 3
        gate.release(held)
    assert got == [10]
    assert gate.try_acquire(4) == 0  # the waiter holds them all
    gate.release(10)


async def test_meanwhile_runs_once_a_wait_lasts_and_the_place_in_line_is_kept() -> None:
    gate = FairGate(4)
    held = await gate.acquire(4)
    calls: list[str] = []
    got: list[str] = []

    async def flush() -> None:
        calls.append("flush")

    async def first() -> None:
        got.append("first" + str(await gate.acquire(4, meanwhile=flush, after_s=0.01)))

    async def second() -> None:
        got.append("second" + str(await gate.acquire(4)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.sleep(0.001)
        tg.start_soon(second)
        await anyio.sleep(0.05)  # past after_s: flushed, still first in line
        assert calls == ["flush"] and gate.waiting == 2
        gate.release(held)
        await anyio.sleep(0.01)
        assert got == ["first4"]
        gate.release(4)
    assert got == ["first4", "second4"]
    gate.release(4)  # second's
    # Granted before after_s: meanwhile never runs.
    calls.clear()
    held = await gate.acquire(4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.sleep(0.001)
        gate.release(held)
    assert calls == []


async def test_cancelled_waiters_neither_block_nor_leak_tokens() -> None:
    gate = FairGate(2)
    held = await gate.acquire(2)
    with anyio.move_on_after(0.02):
        await gate.acquire(1)
    assert gate.waiting == 0
    gate.release(held)
    assert gate.available == 2
    assert await gate.acquire(5) == 2


async def test_over_release_is_a_bug() -> None:
    gate = FairGate(1)
    with pytest.raises(RuntimeError):
        gate.release(1)
    with pytest.raises(ValueError):
        FairGate(0)
