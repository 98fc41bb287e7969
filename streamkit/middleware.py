"""Middlewares: one async hook around every handled entry and every publish.

A :class:`Middleware` wraps five calls; each method gets a context and a
``call_next`` coroutine function and returns what ``call_next`` returned (or
its own result, to short-circuit):

* ``consume``: one entry of a per-entry handler.  The innermost step runs the
  handler *and* the failure policy, so a middleware sees the decision
  (:class:`ConsumeResult`: acked, retried, dead-lettered or halted) and the
  handler's duration.
* ``consume_read``: every entry of one read of one shard, handled one by one
  by a per-entry handler (each through ``consume``); a result per handler
  call.  An observer that only counts and times belongs here: it costs one
  call per read instead of one per entry.
* ``consume_batch``: one call of a batch handler (a result per entry).
* ``publish`` / ``publish_many``: one ``Publisher.publish`` / ``publish_many``
  call; ``ctx.fields`` may be changed before ``call_next``.

Two plain (not async) methods are the cheap alternative to ``consume`` for an
observer that must act around every entry (tracing sets the handler's
context): ``enter_consume`` runs just before an entry's handler call,
``exit_consume`` just after it with what ``enter_consume`` returned and the
result (None if the call was cancelled).  The poller calls them inline,
outside every ``consume`` level and whatever the middleware's place in the
list, without the context object, the ``call_next`` and the coroutine that a
``consume`` level costs per entry (about 1 µs, most of a handled entry's
budget with hiredis).

The first middleware in the list is the outermost.  A method that is not
overridden passes through, and a chain with no middlewares costs nothing: the
poller and the publisher call straight through when the list is empty.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamkit.results import ConsumeResult, Outcome, PublishResult

if TYPE_CHECKING:
    from streamkit.consumer.message import Message

__all__ = [
    "BatchContext",
    "Chain",
    "ConsumeContext",
    "ConsumeResult",
    "Middleware",
    "Outcome",
    "PublishContext",
    "PublishManyContext",
    "ReadContext",
    "chain",
    "inline_hooks",
]


@dataclass(slots=True)
class ConsumeContext:
    """One entry about to be handled."""

    message: Message
    stream_prefix: str
    consumer_group: str
    member_id: str
    #: Scratch space shared by the middlewares of this call.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def shard(self) -> int:
        return self.message.shard


@dataclass(slots=True)
class _ShardEntries:
    """Entries of one shard about to be handled, and who handles them."""

    messages: list[Message]
    stream_prefix: str
    consumer_group: str
    member_id: str
    #: Scratch space shared by the middlewares of this call.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def shard(self) -> int:
        return self.messages[0].shard


@dataclass(slots=True)
class ReadContext(_ShardEntries):
    """The entries of one read of one shard, about to be handled one by one.

    Not calling ``call_next`` leaves them pending (they come back).
    """


@dataclass(slots=True)
class BatchContext(_ShardEntries):
    """One batch (entries of one shard) about to be handed to a batch handler."""


@dataclass(slots=True)
class PublishContext:
    """One ``publish`` call; a middleware may replace ``fields``."""

    partition_key: Any
    fields: Any
    stream_prefix: str
    consumer_group: str
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class PublishManyContext:
    """One ``publish_many`` call; ``items`` are ``(partition_key, fields)`` pairs."""

    items: list[tuple[Any, Any]]
    stream_prefix: str
    consumer_group: str
    state: dict[str, Any] = field(default_factory=dict)


ConsumeNext = Callable[[], Awaitable[ConsumeResult]]
ReadNext = Callable[[], Awaitable[list[ConsumeResult]]]
BatchNext = Callable[[], Awaitable[list[ConsumeResult]]]
PublishNext = Callable[[], Awaitable[PublishResult]]
PublishManyNext = Callable[[], Awaitable[list[PublishResult]]]


class Middleware:
    """Override the methods you need; the others pass through."""

    #: False: the chain leaves this middleware out of the calls it builds from
    #: now on (tracing while no tracer provider is installed).  Read once per
    #: call: a plain attribute, or a very cheap property.
    active: bool = True

    async def consume(self, ctx: ConsumeContext, call_next: ConsumeNext) -> ConsumeResult:
        return await call_next()

    async def consume_read(self, ctx: ReadContext, call_next: ReadNext) -> list[ConsumeResult]:
        return await call_next()

    def enter_consume(
        self, message: Message, stream_prefix: str, consumer_group: str, member_id: str
    ) -> Any:
        """Before one entry's handler call (inline, see the module docstring)."""
        return None

    def exit_consume(self, token: Any, result: ConsumeResult | None) -> None:
        """After it: ``token`` is what ``enter_consume`` returned."""

    async def consume_batch(self, ctx: BatchContext, call_next: BatchNext) -> list[ConsumeResult]:
        return await call_next()

    async def publish(self, ctx: PublishContext, call_next: PublishNext) -> PublishResult:
        return await call_next()

    async def publish_many(
        self, ctx: PublishManyContext, call_next: PublishManyNext
    ) -> list[PublishResult]:
        return await call_next()


C = TypeVar("C")
R = TypeVar("R")


def chain(
    middlewares: Sequence[Middleware],
    method: str,
    ctx: C,
    innermost: Callable[[], Awaitable[R]],
) -> Awaitable[R]:
    """Run ``innermost`` wrapped by ``middlewares`` (first = outermost) for ``method``.

    Runs per entry, so it is kept cheap: the middlewares that override
    ``method`` are looked up once per list (a pass-through level would cost a
    coroutine for nothing), inactive ones are left out, and each level's
    ``call_next`` is a ``functools.partial`` (built in C) rather than a new
    Python closure.
    """
    return Chain.run(_active(reversed(_overriding(middlewares, method))), ctx, innermost)


class Chain(Generic[C, R]):
    """``chain`` for one fixed list of middlewares and one method.

    For a per-entry path that runs the same list every time (the poller): the
    overriding middlewares are looked up once, here, instead of on each call.
    ``__call__`` reads ``active`` on every call; a caller that runs many
    calls in a row takes ``active_levels()`` once and passes it to ``run``.
    """

    __slots__ = ("_levels",)

    def __init__(self, middlewares: Sequence[Middleware], method: str) -> None:
        self._levels = tuple(reversed(_overriding(middlewares, method)))

    def __bool__(self) -> bool:
        return bool(self._levels)

    def __call__(self, ctx: C, innermost: Callable[[], Awaitable[R]]) -> Awaitable[R]:
        return Chain.run(self.active_levels(), ctx, innermost)

    def active_levels(self) -> Levels:
        """The levels active now, innermost first (empty: call straight through)."""
        levels = self._levels
        return _active(levels) if levels else levels

    @staticmethod
    def run(levels: Levels, ctx: C, innermost: Callable[[], Awaitable[R]]) -> Awaitable[R]:
        """Run ``innermost`` wrapped by ``levels`` (from ``active_levels``)."""
        call: Callable[[], Awaitable[R]] = innermost
        for _middleware, bound in levels:
            call = partial(bound, ctx, call)
        return call()


def inline_hooks(middlewares: Sequence[Middleware]) -> tuple[Middleware, ...]:
    """The middlewares that override ``enter_consume``, in list order."""
    base = Middleware.enter_consume
    return tuple(m for m in middlewares if type(m).enter_consume is not base)


def _active(levels: Iterable[_Level]) -> Levels:
    """The levels whose middleware is active now (``Middleware.active``)."""
    return tuple(level for level in levels if level[0].active)


_Level = tuple[Middleware, Callable[..., Any]]
#: A chain's levels, innermost first: what ``Chain.active_levels`` returns.
Levels = tuple[_Level, ...]
# (middlewares, method) -> (middleware, bound method) of those that override it.
# Bounded: a process builds few middleware lists (tests build more).
_CHAINS: dict[tuple[tuple[Middleware, ...], str], tuple[_Level, ...]] = {}
_CHAINS_MAX = 256


def _overriding(middlewares: Sequence[Middleware], method: str) -> tuple[_Level, ...]:
    key = (middlewares if isinstance(middlewares, tuple) else tuple(middlewares), method)
    found = _CHAINS.get(key)
    if found is None:
        base = getattr(Middleware, method)
        found = tuple(
            (m, getattr(m, method)) for m in key[0] if getattr(type(m), method) is not base
        )
        if len(_CHAINS) >= _CHAINS_MAX:
            _CHAINS.clear()
        _CHAINS[key] = found
    return found
