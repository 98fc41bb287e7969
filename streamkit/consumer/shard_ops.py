"""``ShardOps``: a member's shard operations, one after another per shard.

The heartbeat loop never waits for a hook or a drain: each reaction (assign,
revoke) runs as a task, so a slow ``on_revoked`` never delays a heartbeat.
Operations on one shard still run strictly in order (assign, then revoke,
then assign again): each waits for the last one queued for any of its shards.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskGroup

__all__ = ["ShardOps"]

Operation = Callable[[frozenset[int]], Awaitable[None]]


class ShardOps:
    """The shard operations of one member, run as tasks of its task group."""

    def __init__(self) -> None:
        # Per shard, the completion event of the last operation queued for it.
        self._tails: dict[int, anyio.Event] = {}
        self._ops: dict[anyio.CancelScope, frozenset[int]] = {}

    def spawn(self, tg: TaskGroup, shards: frozenset[int], operation: Operation) -> None:
        """Run ``operation(shards)`` after every earlier operation on those shards."""
        previous = {self._tails[s] for s in shards if s in self._tails}
        done = anyio.Event()
        for shard in shards:
            self._tails[shard] = done
        scope = anyio.CancelScope()
        self._ops[scope] = shards
        tg.start_soon(self._run, scope, previous, done, operation, shards)

    async def _run(
        self,
        scope: anyio.CancelScope,
        previous: set[anyio.Event],
        done: anyio.Event,
        operation: Operation,
        shards: frozenset[int],
    ) -> None:
        try:
            with scope:
                for event in previous:
                    await event.wait()
                await operation(shards)
        finally:
            self._ops.pop(scope, None)
            done.set()
            for shard in shards:
                if self._tails.get(shard) is done:
                    del self._tails[shard]

    def cancel_all(self) -> None:
        """Cancel every operation (forgets their order: nothing runs after them)."""
        for scope in list(self._ops):
            scope.cancel()
        self._tails.clear()

    async def wait_all(self) -> None:
        """Until every operation queued so far has finished."""
        for done in list(self._tails.values()):
            await done.wait()
