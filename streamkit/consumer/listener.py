"""Listener declarations: what ``@app.stream_listener`` and ``app.shard_listener`` record.

Everything is validated when the decorator runs, so a typo fails at import
time with a clear message instead of at the first heartbeat.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from streamkit.consumer.failure import FailurePolicy
from streamkit.consumer.handlers import (
    BatchHandler,
    Handler,
    HandlerShape,
    HandlerSignatureError,
    adapt_batch,
    adapt_single,
    inspect_handler,
)
from streamkit.consumer.idempotence import Idempotence
from streamkit.consumer.lifecycle import ShardLifecycle
from streamkit.consumer.options import (
    IN_FLIGHT_BATCHES,
    PollerOptions,
)
from streamkit.errors import StreamkitError
from streamkit.publisher.decorator import PUBLISHED_BY
from streamkit.publisher.encoding import PAYLOAD_FIELD

__all__ = ["Listener", "ListenerConfigError", "MessageHandler"]

#: A handler: ``async def f(msg)`` or a plain ``def f(msg)`` (run in a worker thread);
#: see ``streamkit.consumer.handlers`` for typed and batch signatures.
MessageHandler = Callable[..., Any]

# Same rules as the coordinator's: braces would change the cluster hash tag,
# '/' and '%' cannot travel in one URL path segment, whitespace and control
# characters make keys and logs ambiguous.
_FORBIDDEN: Final = re.compile(r"[\s{}/%\x00-\x1f\x7f]")
_MAX_NAME: Final = 200


_ACKS_BEFORE_PUBLISHING: Final = (
    "listener {}: auto_ack=False with a @publisher would let the handler ack an entry "
    "before its result is published; drop auto_ack=False so it is acked after publishing"
)


class ListenerConfigError(StreamkitError, ValueError):
    """A listener was declared with invalid settings."""


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ListenerConfigError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_NAME:
        raise ListenerConfigError(f"{what} must be at most {_MAX_NAME} characters")
    if value in (".", ".."):
        raise ListenerConfigError(f"{what} may not be {value!r} (a URL path would drop it)")
    found = _FORBIDDEN.search(value)
    bad = found.group() if found else _unsafe_char(value)
    if bad:
        raise ListenerConfigError(
            f"{what} {value!r} contains {bad!r}; braces, '/', '%', whitespace, control and "
            "format characters are not allowed"
        )
    return value


def _unsafe_char(value: str) -> str | None:
    # The coordinator's rule (store/provisioning.py): control, format (U+202E),
    # surrogate and line/paragraph separator characters.
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            return char
    return None


def _check_lifecycle(value: object) -> ShardLifecycle:
    if not isinstance(value, ShardLifecycle):
        raise ListenerConfigError(
            f"lifecycle must implement ShardLifecycle (async on_assigned, on_revoked, "
            f"on_lost), got {value!r}"
        )
    return value


def _check_positive(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ListenerConfigError(f"{what} must be an integer >= 1, got {value!r}")
    return value


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
    #: What the handler's signature asks for (None without a handler).
    shape: HandlerShape | None = None
    #: None: the app-wide default (``FailurePolicy.from_settings``).
    failure_policy: FailurePolicy | None = None
    #: The field a typed handler's JSON payload is decoded from.
    payload_field: str = PAYLOAD_FIELD

    @classmethod
    def create(
        cls,
        *,
        stream_prefix: object,
        group: object,
        concurrency: object,
        handler: object,
        lifecycle: object,
        batch_size: object,
        max_in_flight: object,
        block_ms: object,
        ordered: bool,
        auto_ack: bool | None,
        claim_pending: bool,
        batch: bool | None,
        failure_policy: object,
        payload_field: object,
        idempotent: object,
    ) -> Listener:
        """A listener with a handler, every option checked.

        No defaults here: ``StreamKit.stream_listener`` owns them (its
        signature is the documented one) and passes every option.
        """
        prefix = _check_name("stream_prefix", stream_prefix)
        consumer_group = _check_name("group", group)
        members = _check_positive("concurrency", concurrency)
        per_read = _check_positive("batch_size", batch_size)
        in_flight = (
            per_read * IN_FLIGHT_BATCHES
            if max_in_flight is None
            else _check_positive("max_in_flight", max_in_flight)
        )
        block = _check_positive("block_ms", block_ms)
        if not callable(handler):
            raise ListenerConfigError(
                f"the handler of listener {prefix}/{consumer_group} must be callable, "
                f"got {handler!r}"
            )
        name = getattr(handler, "__qualname__", None) or type(handler).__name__
        try:
            shape = inspect_handler(handler, batch)
        except HandlerSignatureError as exc:
            raise ListenerConfigError(
                f"handler {name} of listener {prefix}/{consumer_group}: {exc}"
            ) from None
        if failure_policy is not None and not isinstance(failure_policy, FailurePolicy):
            raise ListenerConfigError(
                f"failure_policy must be a FailurePolicy, got {failure_policy!r}"
            )
        if not isinstance(payload_field, str) or not payload_field:
            raise ListenerConfigError(
                f"payload_field must be a non-empty string, got {payload_field!r}"
            )
        publishes = bool(getattr(handler, PUBLISHED_BY, ()))
        if auto_ack is None:
            # A handler that never sees its messages cannot ack them; a batch
            # handler acks what it did not settle or fail; one whose result is
            # published is acked once that was published.
            auto_ack = shape.batch or not shape.receives_messages or publishes
        elif not auto_ack and publishes:
            raise ListenerConfigError(_ACKS_BEFORE_PUBLISHING.format(f"{prefix}/{consumer_group}"))
        elif not auto_ack and not shape.receives_messages:
            raise ListenerConfigError(
                f"listener {prefix}/{consumer_group}: auto_ack=False, but the handler does not "
                "receive its messages, so nothing could ever ack them"
            )
        if isinstance(idempotent, Idempotence):
            idempotence: Idempotence | None = idempotent
        elif idempotent is True:
            idempotence = Idempotence()
        elif idempotent is False:
            idempotence = None
        else:
            raise ListenerConfigError(
                f"idempotent must be True, False or an Idempotence, got {idempotent!r}"
            )
        return cls(
            stream_prefix=prefix,
            consumer_group=consumer_group,
            concurrency=members,
            handler=handler,
            lifecycle=None if lifecycle is None else _check_lifecycle(lifecycle),
            options=PollerOptions(
                batch_size=per_read,
                max_in_flight=in_flight,
                block_ms=block,
                ordered=bool(ordered),
                auto_ack=bool(auto_ack),
                claim_pending=bool(claim_pending),
                batch=shape.batch,
                idempotence=idempotence,
            ),
            name=str(name),
            shape=shape,
            failure_policy=failure_policy,
            payload_field=payload_field,
        )

    @classmethod
    def for_lifecycle(
        cls, *, stream_prefix: object, group: object, lifecycle: object, concurrency: object
    ) -> Listener:
        """Members without the built-in poller: ``lifecycle`` does the reading."""
        return cls(
            stream_prefix=_check_name("stream_prefix", stream_prefix),
            consumer_group=_check_name("group", group),
            concurrency=_check_positive("concurrency", concurrency),
            handler=None,
            lifecycle=_check_lifecycle(lifecycle),
            # The defaults, as before: no built-in poller reads for these members.
            options=PollerOptions(),
            name=type(lifecycle).__name__,
        )

    def check_publishes(self) -> None:
        """Refuse a ``@publisher`` on a handler that acks by itself (``auto_ack=False``)."""
        if self.handler is not None and not self.options.auto_ack:
            raise ListenerConfigError(
                _ACKS_BEFORE_PUBLISHING.format(self.stream_prefix + "/" + self.consumer_group)
            )

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream_prefix, self.consumer_group)

    def member_ids(self, base: str) -> list[str]:
        """``{base}-m0 .. {base}-m{N-1}``, where ``base`` already carries this
        start's random part unless membership is static (``member_id_prefix``)."""
        _check_name("member_id_base (STREAMKIT_MEMBER_ID_BASE)", base)
        return [f"{base}-m{i}" for i in range(self.concurrency)]

    def async_handler(self) -> Handler | None:
        """A one-message handler as a coroutine function (sync ones hop to a thread)."""
        if self.handler is None or self.shape is None or self.shape.batch:
            return None
        return adapt_single(self.handler, self.shape, self.payload_field)

    def batch_handler(self) -> BatchHandler | None:
        """A batch handler as a coroutine function (sync ones hop to a thread)."""
        if self.handler is None or self.shape is None or not self.shape.batch:
            return None
        return adapt_batch(self.handler, self.shape, self.payload_field)
