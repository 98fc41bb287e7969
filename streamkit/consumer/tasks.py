"""Running one read's handlers at once (``ordered=False``), cheaply.

An anyio task group spends several times what an asyncio task costs on each
task it starts (a cancel scope and an event per task handle), and an
unordered listener starts one per entry: more than the rest of handling a
small entry (figures: docs/performance.md, "Consumer throughput").
:func:`run_concurrently` keeps the task group's contract for this one use:
every coroutine runs in a task of its own; the call returns only when all
of them have finished; cancelled, it cancels them and waits
for them (shielded) before it re-raises; one that raises gets the others
cancelled, and the errors come out as an exception group.

asyncio only, which the consumer is already (redis-py's asyncio client).
One difference remains: a task is cancelled once, the asyncio way, where an
anyio scope cancels again at every await; a handler that swallows
``CancelledError`` keeps running until it returns, and stopping waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

import anyio

__all__ = ["run_concurrently"]


async def run_concurrently(coroutines: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run ``coroutines`` as concurrent tasks; return when all have finished."""
    if not coroutines:
        return
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(coroutine) for coroutine in coroutines]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        # Cancelled (the shard was lost, the app stops): nothing may outlive
        # this call, so the handlers are cancelled and waited for.
        await _cancel_and_wait(tasks)
        raise
    if pending:  # one raised: the others stop too, as in a task group
        await _cancel_and_wait(pending)
    errors = [
        error for task in tasks if not task.cancelled() and (error := task.exception()) is not None
    ]
    if errors:
        raise BaseExceptionGroup("unhandled errors in a handler task", errors)


async def _cancel_and_wait(tasks: Sequence[asyncio.Task[None]] | set[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    # Shielded: anyio keeps re-cancelling a task inside a cancelled scope,
    # which would end this wait before the handlers' cleanup ran.
    with anyio.CancelScope(shield=True):
        await asyncio.wait(tasks)
