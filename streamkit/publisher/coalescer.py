"""Coalesce concurrent single Redis commands into one pipeline (group commit).

Many tasks that each ``await publisher.publish(...)`` would otherwise pay one
round trip each, although their calls arrive within the same event-loop turn.
:class:`CommandCoalescer` sends them as one non-transactional pipeline, each
caller getting its own reply or its own error; a lone call is sent at once,
so a single caller never waits for a window.  When, how large and in which
order batches go out: docs/architecture.md ("The publisher").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

__all__ = ["CommandCoalescer"]

Command = tuple[Any, ...]
#: Sends commands as one pipeline; returns one reply per command, in order,
#: where a failed command's reply is its exception (``raise_on_error=False``).
SendMany = Callable[[Sequence[Command]], Awaitable[Sequence[Any]]]
SendOne = Callable[..., Awaitable[Any]]


class CommandCoalescer:
    """Send concurrent commands as one pipeline; see the module docstring.

    Counters: ``sent`` (commands), ``pipelines`` (batches of two or more sent
    as a pipeline), ``singles`` (commands sent alone).
    """

    def __init__(
        self,
        send_one: SendOne,
        send_many: SendMany,
        *,
        window: float = 0.0,
        max_batch: int = 1000,
        max_in_flight: int = 2,
    ) -> None:
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._send_one = send_one
        self._send_many = send_many
        self.window = window
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        # Leaders waiting for a send in the air to be answered.
        self._waiters: list[asyncio.Future[None]] = []
        # (command, future) of the batch being collected; redis-py is asyncio
        # only, and a bare future is the cheapest way to hand back one reply.
        self._collecting: list[tuple[Command, asyncio.Future[Any]]] | None = None
        self._in_flight = 0
        self.sent = 0
        self.pipelines = 0
        self.singles = 0

    async def execute(self, *command: Any) -> Any:
        """Send ``command`` (alone or with others) and return its reply."""
        batch = self._collecting
        if batch is not None:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            batch.append((command, future))
            if len(batch) >= self.max_batch:
                self._collecting = None  # full: the next caller starts a new batch
                self._wake()  # a full batch does not wait for the in-flight limit
            return await future
        if self._in_flight == 0:
            # Nothing in the air: nobody to wait for, send at once.
            self._in_flight += 1
            self.sent += 1
            self.singles += 1
            try:
                return await self._send_one(*command)
            finally:
                self._in_flight -= 1
                self._wake()
        return await self._lead(command)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _lead(self, command: Command) -> Any:
        own: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch = [(command, own)]
        self._collecting = batch
        with anyio.CancelScope(shield=True):
            try:
                await asyncio.sleep(self.window)  # let the callers of this turn join
                loop = asyncio.get_running_loop()
                while self._in_flight >= self.max_in_flight and len(batch) < self.max_batch:
                    # Group commit: keep collecting until a send in the air is
                    # answered. Bounded by that send's round trip (the
                    # client's socket timeout at worst).
                    waiter: asyncio.Future[None] = loop.create_future()
                    self._waiters.append(waiter)
                    await waiter
                    # The callers that answer woke run in this turn; one more
                    # turn lets those that call again right away join.
                    await asyncio.sleep(0)
            finally:
                if self._collecting is batch:
                    self._collecting = None
            self._in_flight += 1
            try:
                await self._send(batch)
            finally:
                self._in_flight -= 1
                self._wake()
        return own.result()

    async def _send(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
        self.sent += len(batch)
        outcomes: Sequence[Any]
        try:
            if len(batch) == 1:
                self.singles += 1
                outcomes = [await self._send_one(*batch[0][0])]
            else:
                self.pipelines += 1
                outcomes = await self._send_many([command for command, _ in batch])
        except Exception as exc:
            outcomes = [exc] * len(batch)
        except BaseException as exc:  # the leader itself is going away: fail the batch
            outcomes = [RuntimeError(f"coalesced command was not answered: {exc!r}")] * len(batch)
            raise
        finally:
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():  # its caller was cancelled
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
