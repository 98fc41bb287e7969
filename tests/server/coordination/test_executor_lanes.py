"""The executor's lanes: one batch of a group at a time, every caller answered.

Callers that arrive while a batch runs wait on their own future; the caller
that ran the batch hands the next one to the first of them still waiting
(``executor.submit``).  Whatever callers are cancelled meanwhile, and
whenever, the lane must not stall: every caller not cancelled is answered,
in the order the operations were submitted, and a later caller runs.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import streamkit_server.coordination.executor as executor_module
from streamkit.testing import AsyncRedisClient, RedisTarget, redis_client
from streamkit_server.coordination.executor import GroupExecutor, Operation
from streamkit_server.coordination.operations import create_group_op
from streamkit_server.core import GroupMetadata, Result
from streamkit_server.observability.metrics import Metrics
from streamkit_server.settings import ServerSettings
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.metadata import MetadataStore

from ..sim import KEY_PREFIX

Lane = tuple[GroupExecutor, GroupKeys]

pytestmark = pytest.mark.redis


class Ops:
    """Operations that answer their number and record the order they ran in."""

    def __init__(self) -> None:
        self.applied: list[int] = []

    def op(self, n: int) -> Operation[int]:
        def run(group: GroupMetadata | None, now: int) -> Result[int]:
            self.applied.append(n)
            return Result(group, (), n)

        run.n = n  # type: ignore[attr-defined]
        return run


async def _executor(client: AsyncRedisClient, target: RedisTarget, group: str) -> Lane:
    settings = ServerSettings(redis_url=target.url, key_prefix=KEY_PREFIX)
    metrics = Metrics()
    store = MetadataStore(client, KEY_PREFIX, metrics)
    executor = GroupExecutor(store, settings, metrics)
    keys = store.group_keys("lanes", group)
    await executor.submit(keys, create_group_op(keys, [0, 1]))
    return executor, keys


async def _lanes(target: RedisTarget, seed: int) -> None:
    rng = random.Random(seed)
    client = redis_client(target)
    try:
        executor, keys = await _executor(client, target, f"g{seed}")
        ops = Ops()
        op, applied = ops.op, ops.applied
        running = 0

        def watched(n: int) -> Operation[int]:
            inner = op(n)

            def run(group: GroupMetadata | None, now: int) -> Result[int]:
                nonlocal running
                running += 1
                assert running == 1, "two batches of one group at once"
                try:
                    return inner(group, now)
                finally:
                    running -= 1

            return run

        callers = [asyncio.create_task(executor.submit(keys, watched(n))) for n in range(60)]
        for _ in range(12):  # cancel some, at random moments
            await asyncio.sleep(rng.random() * 0.002)
            rng.choice(callers).cancel()
        done = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), 10)
        answered = [r for r in done if not isinstance(r, BaseException)]
        assert all(r == n for n, r in enumerate(done) if not isinstance(r, BaseException))
        assert all(isinstance(r, asyncio.CancelledError) for r in done if r not in answered)
        assert answered, "every caller cancelled: draw another seed"
        # In submission order (a batch may run twice: on the process's copy,
        # then under the mutex); a cancelled caller's operation may run or not.
        first_runs = list(dict.fromkeys(applied))
        assert first_runs == sorted(first_runs) and set(answered) <= set(applied)
        # The lane still runs: a caller after all that is answered.
        assert await asyncio.wait_for(executor.submit(keys, op(99)), 10) == 99
    finally:
        await client.aclose()


@pytest.mark.parametrize("seed", range(6))
def test_no_caller_is_left_waiting(any_redis: RedisTarget, seed: int) -> None:
    asyncio.run(_lanes(any_redis, seed))


async def _handed_then_cancelled(target: RedisTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis_client(target)
    try:
        executor, keys = await _executor(client, target, "handed")
        ops = Ops()
        callers: dict[int, asyncio.Task[int]] = {}
        hand_off = executor_module._hand_off
        cancelled: list[int] = []

        def hand_off_then_cancel(lane: Any) -> None:
            # The caller just handed the next batch is cancelled before it
            # runs again: the moment no random schedule reliably hits.
            hand_off(lane)
            for item in lane.pending:
                if not cancelled and executor_module._handed(item.future):
                    cancelled.append(item.op.n)
                    callers[item.op.n].cancel()

        monkeypatch.setattr(executor_module, "_hand_off", hand_off_then_cancel)
        for n in range(5):  # 0 runs the first batch, 1..4 wait for it
            callers[n] = asyncio.create_task(executor.submit(keys, ops.op(n)))
        done = await asyncio.wait_for(asyncio.gather(*callers.values(), return_exceptions=True), 10)
        assert cancelled == [1]
        assert isinstance(done[1], asyncio.CancelledError)
        assert [d for n, d in enumerate(done) if n != 1] == [0, 2, 3, 4]
    finally:
        await client.aclose()


def test_a_caller_cancelled_once_handed_the_batch_hands_it_on(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = RedisTarget(url=redis_url, cluster=False)
    asyncio.run(_handed_then_cancelled(target, monkeypatch))
