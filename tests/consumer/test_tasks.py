"""run_concurrently keeps a task group's contract: concurrent tasks, nothing
outlives the call (cancelled or not), and an error stops the others."""

from __future__ import annotations

import anyio
import pytest

from streamkit.consumer.tasks import run_concurrently


async def test_every_coroutine_runs_at_once_and_all_finish_before_it_returns() -> None:
    started: list[int] = []
    finished: list[int] = []
    everyone_in = anyio.Event()

    async def one(n: int) -> None:
        started.append(n)
        if len(started) == 5:
            everyone_in.set()
        # Only returns once all five started: they run concurrently.
        await everyone_in.wait()
        await anyio.sleep(0.001 * n)
        finished.append(n)

    with anyio.fail_after(5):
        await run_concurrently([one(n) for n in range(5)])
    assert started == [0, 1, 2, 3, 4]  # started in order
    assert sorted(finished) == [0, 1, 2, 3, 4]


async def test_cancelled_it_cancels_the_tasks_and_waits_for_their_cleanup() -> None:
    events: list[str] = []
    running = anyio.Event()

    async def one(n: int) -> None:
        try:
            running.set()
            await anyio.sleep_forever()
        finally:
            # Cleanup that itself waits: it must be over before the call returns.
            await anyio.sleep(0.02)
            events.append(f"cleaned {n}")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def host() -> None:
                try:
                    await run_concurrently([one(n) for n in range(3)])
                finally:
                    events.append("returned")

            tg.start_soon(host)
            await running.wait()
            tg.cancel_scope.cancel()
    assert sorted(events[:3]) == ["cleaned 0", "cleaned 1", "cleaned 2"]
    assert events[3:] == ["returned"]


async def test_an_error_cancels_the_others_and_is_raised_in_a_group() -> None:
    cancelled: list[int] = []

    async def slow(n: int) -> None:
        try:
            await anyio.sleep_forever()
        except BaseException:
            cancelled.append(n)
            raise

    async def failing() -> None:
        await anyio.sleep(0.01)
        raise ValueError("boom")

    with anyio.fail_after(5), pytest.raises(BaseExceptionGroup) as caught:
        await run_concurrently([slow(0), failing(), slow(1)])
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
    assert sorted(cancelled) == [0, 1]


async def test_nothing_to_run() -> None:
    await run_concurrently([])
