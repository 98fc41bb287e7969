"""Listener declarations: what ``@app.stream_listener`` and ``app.shard_listener`` record.

Everything is validated when the decorator runs, so a typo fails at import
time with a clear message instead of at the first heartbeat.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio.to_thread

from streamkit.errors import StreamkitError
from streamkit.lifecycle import ShardLifecycle
from streamkit.message import Message
from streamkit.poller import Handler, PollerOptions

__all__ = ["Listener", "ListenerConfigError", "MessageHandler"]

#: A handler: ``async def f(msg)`` or a plain ``def f(msg)`` (run in a worker thread).
MessageHandler = Callable[[Message], Any]

# Same rules as the coordinator's: braces would change the cluster hash tag,
# '/' and '%' cannot travel in one URL path segment, whitespace and control
# characters make keys and logs ambiguous.
_FORBIDDEN: Final = re.compile(r"[\s{}/%\x00-\x1f\x7f]")
_MAX_NAME: Final = 200
DEFAULT_BATCH_SIZE: Final = 100
DEFAULT_BLOCK_MS: Final = 2_000
#: Default in-flight budget of a member, in batches.
IN_FLIGHT_BATCHES: Final = 4


class ListenerConfigError(StreamkitError, ValueError):
    """A listener was declared with invalid settings."""


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ListenerConfigError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_NAME:
        raise ListenerConfigError(f"{what} must be at most {_MAX_NAME} characters")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise ListenerConfigError(
            f"{what} {value!r} contains {bad.group()!r}; braces, '/', '%', whitespace and "
            "control characters are not allowed"
        )
    return value


def _check_positive(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ListenerConfigError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and inspect.iscoroutinefunction(call)


def _threaded(fn: Callable[[Message], Any]) -> Handler:
    @functools.wraps(fn)
    async def run_in_thread(message: Message) -> None:
        # Sync handlers block; keep them off the event loop.  ack() works
        # from the thread: it only queues the id.
        result = await anyio.to_thread.run_sync(fn, message)
        if inspect.isawaitable(result):
            await result

    return run_in_thread


@dataclass(frozen=True, slots=True)
class Listener:
    """One declared listener: a group of ``concurrency`` members."""

    stream_prefix: str
    consumer_group: str
    concurrency: int
    handler: MessageHandler | None
    lifecycle: ShardLifecycle | None
    options: PollerOptions
    name: str

    @classmethod
    def create(
        cls,
        *,
        stream_prefix: object,
        group: object,
        concurrency: object = 1,
        handler: object = None,
        lifecycle: object = None,
        batch_size: object = DEFAULT_BATCH_SIZE,
        max_in_flight: object = None,
        block_ms: object = DEFAULT_BLOCK_MS,
        ordered: bool = True,
        auto_ack: bool = False,
        claim_pending: bool = True,
        require_handler: bool = True,
    ) -> Listener:
        prefix = _check_name("stream_prefix", stream_prefix)
        consumer_group = _check_name("group", group)
        members = _check_positive("concurrency", concurrency)
        batch = _check_positive("batch_size", batch_size)
        in_flight = (
            batch * IN_FLIGHT_BATCHES
            if max_in_flight is None
            else _check_positive("max_in_flight", max_in_flight)
        )
        block = _check_positive("block_ms", block_ms)
        if require_handler or handler is not None:
            if not callable(handler):
                raise ListenerConfigError(
                    f"the handler of listener {prefix}/{consumer_group} must be callable, "
                    f"got {handler!r}"
                )
        if lifecycle is not None and not isinstance(lifecycle, ShardLifecycle):
            raise ListenerConfigError(
                f"lifecycle must implement ShardLifecycle (async on_assigned, on_revoked, "
                f"on_lost), got {lifecycle!r}"
            )
        if handler is None and lifecycle is None:
            raise ListenerConfigError(
                f"listener {prefix}/{consumer_group} needs a handler or a lifecycle"
            )
        name = (
            getattr(handler, "__qualname__", None) or type(handler).__name__
            if handler is not None
            else type(lifecycle).__name__
        )
        return cls(
            stream_prefix=prefix,
            consumer_group=consumer_group,
            concurrency=members,
            handler=handler,
            lifecycle=lifecycle,
            options=PollerOptions(
                batch_size=batch,
                max_in_flight=in_flight,
                block_ms=block,
                ordered=bool(ordered),
                auto_ack=bool(auto_ack),
                claim_pending=bool(claim_pending),
            ),
            name=str(name),
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream_prefix, self.consumer_group)

    def member_ids(self, base: str) -> list[str]:
        """``{base}-m0 .. {base}-m{N-1}``: stable across restarts of the same pod,
        so the coordinator recognises a returning member."""
        _check_name("member_id_base (STREAMKIT_MEMBER_ID_BASE)", base)
        return [f"{base}-m{i}" for i in range(self.concurrency)]

    def async_handler(self) -> Handler | None:
        """The handler as a coroutine function (sync ones hop to a thread)."""
        if self.handler is None:
            return None
        if _is_async(self.handler):
            handler: Callable[[Message], Awaitable[None]] = self.handler
            return handler
        return _threaded(self.handler)
