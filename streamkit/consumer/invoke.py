"""Handler invocation: the handler, its middlewares and the failure policy, per call.

An :class:`Invoker` runs the listener's handler on one message (or one batch)
inside the ``consume`` (``consume_batch``) middlewares and turns what happened
into a :class:`~streamkit.results.ConsumeResult`: no decision when the entry
is done, else what the failure policy says (retry after a delay, dead-letter,
halt the shard).  The middlewares wrap the handler and the policy together,
so they see the outcome.  Carrying the decision out is the shard reader's job.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Sequence
from functools import partial

from streamkit.consumer.handlers import BatchHandler, Handler
from streamkit.consumer.message import Message, Settlement
from streamkit.consumer.options import PollerOptions
from streamkit.middleware import (
    BatchContext,
    Chain,
    ConsumeContext,
    Levels,
    Middleware,
    ReadContext,
    inline_hooks,
)
from streamkit.results import Action, ConsumeResult, Decision

__all__ = ["Invoker"]

log = logging.getLogger("streamkit.poller")


class Invoker:
    """Calls one listener's handler for one member."""

    def __init__(
        self,
        *,
        stream_prefix: str,
        consumer_group: str,
        member_id: str,
        options: PollerOptions,
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        middlewares: Sequence[Middleware],
    ) -> None:
        if (handler is None) == (batch_handler is None) or (batch_handler is None) == (
            options.batch
        ):
            raise ValueError("give a handler, or a batch_handler with options.batch")
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group
        self.member_id = member_id
        self.options = options
        self._handler = handler
        self._batch_handler = batch_handler
        middlewares = tuple(middlewares)
        # Built once: ``invoke`` runs per entry (see ``Chain``).
        self._consume_chain: Chain[ConsumeContext, ConsumeResult] = Chain(middlewares, "consume")
        self._batch_chain: Chain[BatchContext, list[ConsumeResult]] = Chain(
            middlewares, "consume_batch"
        )
        # consume_read wraps the reads of a per-entry handler only (a batch
        # handler's read is one consume_batch call).
        self._read_chain: Chain[ReadContext, list[ConsumeResult]] = Chain(
            middlewares if handler is not None else (), "consume_read"
        )
        # Which per-entry levels are active, taken once per read (begin_read).
        self._consume_levels: Levels = self._consume_chain.active_levels()
        # Per-entry inline hooks (enter_consume / exit_consume), per-entry
        # handlers only; the active ones, also taken once per read.
        self._all_hooks = inline_hooks(middlewares) if handler is not None else ()
        self._hooks: tuple[Middleware, ...] = tuple(m for m in self._all_hooks if m.active)

    def begin_read(self) -> Levels:
        """A read is about to be handled: take the active middleware levels.

        Returns the active ``consume_read`` levels, and keeps the active
        ``consume`` levels that ``invoke`` uses until the next read: ``active``
        is read once per read, not per entry.
        """
        self._consume_levels = self._consume_chain.active_levels()
        if self._all_hooks:
            self._hooks = tuple(m for m in self._all_hooks if m.active)
        return self._read_chain.active_levels()

    def read_context(self, messages: list[Message]) -> ReadContext:
        return ReadContext(messages, self.stream_prefix, self.consumer_group, self.member_id)

    async def invoke(self, message: Message) -> ConsumeResult:
        """Run the handler on one message; the result's ``decision`` is None
        when done, else what the policy says."""
        levels = self._consume_levels
        hooks = self._hooks
        if not hooks:
            if not levels:
                return await self._run_one(message)
            ctx = ConsumeContext(message, self.stream_prefix, self.consumer_group, self.member_id)
            return await Chain.run(levels, ctx, partial(self._run_one, message))
        # Inline hooks around the whole call (outside every consume level).
        # One hook (tracing) is the case that runs per entry in production:
        # no token list for it.
        if len(hooks) == 1:
            hook = hooks[0]
            token = hook.enter_consume(
                message, self.stream_prefix, self.consumer_group, self.member_id
            )
            result: ConsumeResult | None = None
            try:
                if levels:
                    result = await self._levels_and_handler(message, levels)
                else:  # the usual case, without the call to find that out
                    result = await self._run_one(message)
                return result
            finally:
                hook.exit_consume(token, result)
        tokens = []
        result = None
        try:
            for hook in hooks:
                tokens.append(
                    hook.enter_consume(
                        message, self.stream_prefix, self.consumer_group, self.member_id
                    )
                )
            result = await self._levels_and_handler(message, levels)
            return result
        finally:
            # Those entered, innermost first.
            for hook, token in zip(reversed(hooks[: len(tokens)]), reversed(tokens), strict=True):
                hook.exit_consume(token, result)

    def _levels_and_handler(self, message: Message, levels: Levels) -> Awaitable[ConsumeResult]:
        if not levels:
            return self._run_one(message)
        ctx = ConsumeContext(message, self.stream_prefix, self.consumer_group, self.member_id)
        return Chain.run(levels, ctx, partial(self._run_one, message))

    async def invoke_batch(self, messages: list[Message]) -> list[ConsumeResult]:
        """Run the batch handler; per message, a result whose ``decision`` is
        None when done, else the policy's decision.

        If it raises, every message it did not settle failed with that error.
        """
        if not self._batch_chain:
            return await self._run_batch(messages)
        ctx = BatchContext(messages, self.stream_prefix, self.consumer_group, self.member_id)
        return await self._batch_chain(ctx, partial(self._run_batch, messages))

    async def invoke_all(self, messages: list[Message]) -> list[ConsumeResult]:
        if self._batch_handler is not None:
            return await self.invoke_batch(messages)
        return [await self.invoke(m) for m in messages]

    async def _run_one(self, message: Message) -> ConsumeResult:
        assert self._handler is not None
        started = time.perf_counter()
        try:
            await self._handler(message)
        except Exception as exc:
            elapsed = time.perf_counter() - started
            return ConsumeResult(self._failed(message, exc), exc, elapsed, message)
        elapsed = time.perf_counter() - started
        settled = message.settled
        if settled is None:
            if self.options.auto_ack:
                message.ack()
            return ConsumeResult(None, None, elapsed, message)
        decision = self._failed(message, None) if settled is Settlement.NACK else None
        return ConsumeResult(decision, None, elapsed, message)

    async def _run_batch(self, messages: list[Message]) -> list[ConsumeResult]:
        assert self._batch_handler is not None
        started = time.perf_counter()
        try:
            errors = await self._batch_handler(messages)
        except Exception as exc:
            elapsed = time.perf_counter() - started
            return [
                ConsumeResult(self._failed(m, exc), exc, elapsed, m)
                if m.settled is None
                else ConsumeResult(self._returned(m), None, elapsed, m)
                for m in messages
            ]
        elapsed = time.perf_counter() - started
        return [
            ConsumeResult(self._failed(m, errors[i]), errors[i], elapsed, m)
            if i in errors
            else ConsumeResult(self._returned(m), None, elapsed, m)
            for i, m in enumerate(messages)
        ]

    def _returned(self, message: Message) -> Decision | None:
        if message.settled is Settlement.NACK:
            return self._failed(message, None)
        if self.options.auto_ack and message.settled is None:
            message.ack()
        return None

    def _failed(self, message: Message, error: BaseException | None) -> Decision:
        decision = self.options.policy.decide(
            message.delivery_count, error, delay_ms=message.nack_delay_ms, rand=random.random()
        )
        if error is not None:
            log.warning(
                "handler failed for %s entry %s (group %s, member %s, attempt %d): %s",
                message.stream_key,
                message.id,
                self.consumer_group,
                self.member_id,
                message.delivery_count,
                _next_step(decision),
                exc_info=error,
            )
        return decision


def _next_step(decision: Decision) -> str:
    if decision.action is Action.RETRY:
        return f"retrying in {decision.delay_ms} ms"
    if decision.action is Action.HALT:
        return "attempts exhausted, halting the shard"
    return "attempts exhausted, dead-lettering it"
