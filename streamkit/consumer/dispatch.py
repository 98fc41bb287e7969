"""Dispatch: the entries of one read, to the handler, in order or all at once.

A :class:`Dispatcher` turns a read's entries into messages, runs the
``consume_read`` middlewares around them, hands them to the
:class:`~streamkit.consumer.invoke.Invoker` and carries out the failure
policy's decisions through the shard reader that read them:

* **ordered** (the default): one entry (or one batch) at a time; a failed one
  is retried in place, after its backoff, before anything after it starts.
  Once the shard may not be read (revoked, lost, lease lapsed) nothing new
  starts and the rest stays pending;
* **unordered**: every entry at once; a failed entry is parked in the shard's
  retry schedule and the others go on (a due retry rides along with a later
  read).

A backoff never delays a revoke: the reader's ``halt()`` interrupts it and the
entry stays pending for the next owner, which goes on counting its attempts.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Protocol

import anyio
from redis.exceptions import RedisError

from streamkit.consumer.invoke import Invoker
from streamkit.consumer.message import Message, SettlementSink
from streamkit.consumer.options import PollerOptions
from streamkit.consumer.shard_io import Entry, LeaseCut
from streamkit.consumer.tasks import run_concurrently
from streamkit.middleware import Chain
from streamkit.results import Action, ConsumeResult, Decision

__all__ = ["DispatchTarget", "Dispatcher"]

log = logging.getLogger("streamkit.poller")

# A dead letter that could not be written is tried again after this long.
_DEAD_LETTER_RETRY_MS = 1_000


class DispatchTarget(SettlementSink, Protocol):
    """The shard reader whose read is being handled, as the dispatcher sees it."""

    shard: int
    #: No new reads (revoked, stopping, lost).
    stopping: bool
    #: The failure policy halted the shard.
    halted: bool
    #: Entries of the current read not finished yet (progress reports).
    in_flight: int

    def may_read(self) -> bool: ...

    def leave_pending(self, ids: list[bytes]) -> None:
        """Fetch these pending entries again before reading new ones."""

    async def flush(self) -> None:
        """Send the acks queued so far."""

    async def interruptibly(self, awaitable: Any) -> Any:
        """Await unless the reader is halted first (then: None)."""

    async def reclaim(self, ids: list[bytes]) -> list[Entry]:
        """``XCLAIM`` our own pending entries again (one more delivery each)."""

    def park(self, message: Message, delay_ms: int) -> None:
        """Retry ``message`` after ``delay_ms`` (unordered)."""

    def halt_shard(self, message: Message, decision: Decision) -> None:
        """``on_exhausted="halt"``: keep the entry pending, stop reading the shard."""

    async def dead_letter(self, message: Message, decision: Decision) -> bool:
        """Dead-letter and ack the entry; False if Redis failed."""


class Dispatcher:
    """Handles the reads of one member's shards (one per poller)."""

    def __init__(self, invoker: Invoker, options: PollerOptions) -> None:
        self.invoker = invoker
        self._ordered = options.ordered
        self._batch = options.batch

    async def handle(
        self, reader: DispatchTarget, entries: list[Entry], counts: dict[bytes, int]
    ) -> None:
        """Handle one read of ``reader``; ``counts``: delivery counts of claimed entries."""
        shard = reader.shard
        if counts:
            messages = [
                Message(
                    reader,
                    shard,
                    entry_id,
                    fields,
                    redelivered=entry_id in counts,
                    delivery_count=counts.get(entry_id, 1),
                )
                for entry_id, fields in entries
            ]
        else:  # first deliveries, the common case: the defaults hold
            messages = [Message(reader, shard, entry_id, fields) for entry_id, fields in entries]
        reader.in_flight = len(messages)
        try:
            levels = self.invoker.begin_read()
            if not levels:
                await self._handle_read(reader, messages, None)
            else:
                ctx = self.invoker.read_context(messages)
                await Chain.run(levels, ctx, partial(self._handle_read, reader, messages, []))
        finally:
            reader.in_flight = 0

    async def _handle_read(
        self,
        reader: DispatchTarget,
        messages: list[Message],
        results: list[ConsumeResult] | None,
    ) -> list[ConsumeResult]:
        """Handle one read; ``results`` (for ``consume_read``) collects each
        handler call's result, None when nobody looks."""
        if self._ordered:
            await self._handle_ordered(reader, messages, results)
        else:
            await self._handle_unordered(reader, messages, results)
        return results if results is not None else []

    # -- ordered -------------------------------------------------------------------------

    async def _handle_ordered(
        self,
        reader: DispatchTarget,
        messages: list[Message],
        results: list[ConsumeResult] | None,
    ) -> None:
        """One entry (or one batch) at a time; a failed one is retried in place
        before anything after it starts."""
        invoker = self.invoker
        batch = self._batch
        step = len(messages) if batch else 1
        for index in range(0, len(messages), step):
            # Start nothing once the shard may not be read: the rest stays
            # pending, for whoever owns the shard next or, if only the lease
            # lapsed, for us once it is renewed.
            if not reader.may_read():
                if not reader.stopping:
                    reader.leave_pending([m.raw_id for m in messages[index:]])
                return
            decisions: list[Decision | None]
            if batch:
                chunk = messages
                decisions = [r.decision for r in await invoker.invoke_batch(chunk)]
            else:
                result = await invoker.invoke(messages[index])
                if results is not None:
                    results.append(result)
                if result.decision is None:  # the common case, kept short
                    reader.in_flight -= 1
                    continue
                chunk, decisions = [messages[index]], [result.decision]
            left = await self._run_in_place(reader, chunk, decisions, results)
            if left:
                if not reader.stopping and not reader.halted:
                    reader.leave_pending([*left, *(m.raw_id for m in messages[index + step :])])
                return
            reader.in_flight -= len(chunk)

    async def _run_in_place(
        self,
        reader: DispatchTarget,
        chunk: list[Message],
        decisions: list[Decision | None],
        results: list[ConsumeResult] | None,
    ) -> list[bytes]:
        """Finish ``chunk`` (handled once, with these outcomes), retrying failures in place.

        Returns the ids (in stream order) of the entries it had to leave
        pending: the shard was halted or stopped, the lease lapsed during a
        backoff, or Redis failed.
        """
        while True:
            retry: list[Message] = []
            delay_ms = 0
            stuck = False
            for message, decision in zip(chunk, decisions, strict=True):
                if decision is None:
                    continue
                if decision.action is Action.RETRY:
                    delay_ms = max(delay_ms, decision.delay_ms)
                elif decision.action is Action.HALT:
                    reader.halt_shard(message, decision)
                    stuck = True
                elif await reader.dead_letter(message, decision):
                    continue
                else:
                    stuck = True
                retry.append(message)
            if not retry:
                return []
            left = [m.raw_id for m in retry]
            if stuck:
                return left
            # Acks of the entries before this one need not wait for its retries.
            await reader.flush()
            await reader.interruptibly(anyio.sleep(delay_ms / 1000))
            if not reader.may_read():
                return left
            try:
                entries = await reader.reclaim(left)
            except (RedisError, OSError, LeaseCut) as exc:
                log.warning("%s: retry of %s failed: %r", reader.member_id, reader.stream_key, exc)
                return left
            # XCLAIM adds exactly one to the counter read at the last delivery.
            before = {m.raw_id: m.delivery_count for m in retry}
            chunk = [
                Message(
                    reader,
                    reader.shard,
                    entry_id,
                    fields,
                    redelivered=True,
                    delivery_count=before[entry_id] + 1,
                )
                for entry_id, fields in entries
            ]
            if not chunk:
                return []  # gone meanwhile (acked elsewhere, deleted, trimmed)
            again = await self.invoker.invoke_all(chunk)
            if results is not None:
                results.extend(again)
            decisions = [r.decision for r in again]

    # -- unordered -----------------------------------------------------------------------

    async def _handle_unordered(
        self,
        reader: DispatchTarget,
        messages: list[Message],
        results: list[ConsumeResult] | None,
    ) -> None:
        """Everything at once; a failed entry is parked, the others go on."""
        invoker = self.invoker
        if self._batch:
            for message, result in zip(messages, await invoker.invoke_batch(messages), strict=True):
                if result.decision is not None:
                    await self._apply_unordered(reader, message, result.decision)
            return

        async def one(message: Message) -> None:
            result = await invoker.invoke(message)
            if results is not None:
                results.append(result)
            if result.decision is not None:
                await self._apply_unordered(reader, message, result.decision)

        # Not an anyio task group: starting a task in one costs more than
        # handling a small entry does (see streamkit.consumer.tasks).
        await run_concurrently([one(message) for message in messages])

    async def _apply_unordered(
        self, reader: DispatchTarget, message: Message, decision: Decision
    ) -> None:
        if decision.action is Action.RETRY:
            reader.park(message, decision.delay_ms)
        elif decision.action is Action.HALT:
            reader.halt_shard(message, decision)
        elif not await reader.dead_letter(message, decision):
            reader.park(message, _DEAD_LETTER_RETRY_MS)
