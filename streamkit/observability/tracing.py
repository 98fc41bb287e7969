"""OpenTelemetry consumer spans, as a middleware (API only: no SDK needed).

Publishers write the W3C ``traceparent`` of their producer span into the
entry (field ``traceparent`` by default: ``STREAMKIT_TRACE_CONTEXT_FIELD``).
:class:`TracingMiddleware` starts one ``CONSUMER`` span per handled entry
whose parent is that producer span, so a trace runs from the publish call
through the handler (and whatever the handler calls).

Sampling follows the producer: an entry whose ``traceparent`` says *not
sampled* (flags ``00``, what a publisher writes when its span was sampled
out) gets no consumer span, and the SDK is not asked. That is the decision
the SDK's default sampler (``ParentBased``) would reach, at a fraction of
its cost (creating a sampled-out span costs more than handling a small entry
does). The handler still runs inside the producer's (unsampled) context, so
what it publishes or calls carries the same decision on.
``TracingMiddleware(follow_parent_sampling=False)`` asks the tracer for every
entry instead, for a sampler that decides on consumer spans by itself.

Inside a read that context is one per read, not one per entry (see
``_DeliverySpan``): the entry's ``traceparent`` sits in a ContextVar of
streamkit's, which a task the handler starts copies.  An OpenTelemetry
``Context`` handed to another thread without the ContextVars (an explicit
``attach`` there) names no parent for a sampled-out entry.
"""

from __future__ import annotations

import logging
import math
import re
import time
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from streamkit.middleware import BatchContext, BatchNext, Middleware, ReadContext, ReadNext
from streamkit.results import ConsumeResult

if TYPE_CHECKING:
    from streamkit.consumer.message import Message

__all__ = ["TracingMiddleware", "parent_context"]

log = logging.getLogger("streamkit.observability.tracing")

_NO_PROVIDER: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_RECHECK_S: Final = 1.0
_TRACEPARENT: Final = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# Recognising the value a publisher sampling at the head writes for most
# entries (version 00, flags 00, lowercase hex ids, neither id zero) was the
# largest part of the sampled-out path as a regular expression with two
# lookaheads (~0.5 µs here).  Without one (~0.37 µs): the flags first (what
# tells most values apart), one ``translate`` that maps every byte to its
# class (``h`` a lowercase hex digit, ``-`` a dash, ``x`` anything else) and
# must give the shape of a traceparent, then the version and the ids' zero
# checks.  Exactly what ``_TRACEPARENT`` accepts with flags 00 and non-zero
# ids, nothing padded (tests/consumer/test_traceparent.py checks they agree).
_CLASSES: Final = bytes(
    0x68 if byte in b"0123456789abcdef" else 0x2D if byte == 0x2D else 0x78 for byte in range(256)
)
_SHAPE: Final = b"hh-" + b"h" * 32 + b"-" + b"h" * 16 + b"-hh"
_ZERO_TRACE_ID: Final = b"0" * 32
_ZERO_SPAN_ID: Final = b"0" * 16
_FLAGS: Final = tuple(trace.TraceFlags(flags) for flags in range(256))
# The key under which the API keeps the current span, learnt through the API.
_SPAN_KEY: Final = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, Context())))


def _current_context_var() -> ContextVar[Context] | None:
    """The ``ContextVar`` behind the API's current context, or None.

    ``attach``/``detach``/``get_current`` are three wrapper calls around one
    ``ContextVar`` operation each, and they ran per handled entry: about a
    quarter of what the common (sampled-out) path cost.  Only the API's
    default runtime context (``contextvars_context``, the one every SDK
    uses) is bypassed this way; another one, chosen with
    ``OTEL_PYTHON_CONTEXT``, keeps going through the API.
    """
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    if type(runtime) is not ContextVarsRuntimeContext:
        return None
    var = getattr(runtime, "_current_context", None)
    return var if isinstance(var, ContextVar) else None


_CURRENT: Final = _current_context_var()


class _Scope:
    """What ``enter_consume`` set up through the API: a span (or None) and the
    API's context token."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace.Span | None, token: object) -> None:
        self.span = span
        self.token = token

    def close(self, result: ConsumeResult | None) -> None:
        span = self.span
        try:
            if span is not None and result is not None and span.is_recording():
                span.set_attribute("streamkit.outcome", result.outcome.value)
                if result.error is not None:
                    span.record_exception(result.error)
                if result.decision is not None:
                    span.set_status(Status(StatusCode.ERROR, result.decision.error))
        finally:
            otel_context.detach(self.token)  # type: ignore[arg-type]
            if span is not None:
                span.end()


class _UnsampledParent(NonRecordingSpan):
    """A producer span that was sampled out, named by a well-formed ``traceparent``.

    Its ``SpanContext`` is built only when something asks for it (a child
    span, a propagator): most handlers never do, and building it (two hex
    parses and ``SpanContext``'s checks) costs more than the rest of the
    middleware together.
    """

    _parsed: SpanContext | None = None

    def __init__(self, raw: bytes) -> None:  # no super().__init__: _context is lazy
        self._raw = raw

    @property
    def _context(self) -> SpanContext:  # type: ignore[override]
        # NonRecordingSpan's own methods (repr) read the attribute.
        return self.get_span_context()

    def get_span_context(self) -> SpanContext:
        if self._parsed is None:
            raw = self._raw
            self._parsed = SpanContext(int(raw[3:35], 16), int(raw[36:52], 16), True, _FLAGS[0])
        return self._parsed


# The ``traceparent`` of the sampled-out entry being handled in this task, set
# per entry by ``enter_consume`` while the read's context holds ``_DELIVERY``.
_DELIVERY_RAW: ContextVar[bytes | None] = ContextVar("streamkit_delivery_traceparent", default=None)


class _DeliverySpan(NonRecordingSpan):
    """The span a read's handlers run under: the producer span of the entry
    being handled, when it was sampled out.

    Building a context and a span per entry (and switching the API's context
    to it) was most of what tracing cost a sampled-out entry.  Instead the
    read's context holds this one span, and each entry only sets
    ``_DELIVERY_RAW``, a ContextVar of its own: what the span says is read from
    the task's context when someone asks.  A task the handler starts copies
    that ContextVar with the rest, so it keeps its entry's trace.  An entry
    that is not a sampled-out one gets a context of its own on top
    (``_Scope``), and outside an entry the span is invalid (no parent).
    """

    _last: tuple[bytes | None, SpanContext] = (None, trace.INVALID_SPAN_CONTEXT)

    def __init__(self) -> None:  # no super().__init__: the context is per task
        pass

    @property
    def _context(self) -> SpanContext:  # type: ignore[override]
        return self.get_span_context()

    def get_span_context(self) -> SpanContext:
        raw = _DELIVERY_RAW.get()
        last = self._last
        if raw is last[0]:
            return last[1]
        if raw is None:
            return trace.INVALID_SPAN_CONTEXT
        parsed = SpanContext(int(raw[3:35], 16), int(raw[36:52], 16), True, _FLAGS[0])
        self._last = (raw, parsed)
        return parsed


_DELIVERY: Final = _DeliverySpan()


def _unsampled_parent(raw: object) -> _UnsampledParent | None:
    """The sampled-out producer span of an exact ``traceparent`` with flags ``00``.

    Anything else (sampled, other flags, padded, malformed) is None: the full
    parse in ``_remote_span_context`` decides those.
    """
    if type(raw) is bytes and _is_unsampled(raw):
        return _UnsampledParent(raw)
    return None


def _is_unsampled(raw: bytes) -> bool:
    """Whether ``raw`` is exactly a valid version-00 ``traceparent`` with flags 00."""
    return (
        raw[53:] == b"00"
        and raw.translate(_CLASSES) == _SHAPE
        and raw[:2] == b"00"
        and raw[3:35] != _ZERO_TRACE_ID
        and raw[36:52] != _ZERO_SPAN_ID
    )


def _with_parent(span: trace.Span) -> Context:
    """The current context with ``span`` as its span: ``set_span_in_context``'s
    result, built in one step (it runs per handled entry)."""
    base = otel_context.get_current()
    return Context({**base, _SPAN_KEY: span} if base else {_SPAN_KEY: span})


def parent_context(value: bytes | str | None) -> Context | None:
    """The remote span named by a ``traceparent`` value; None if absent or malformed."""
    span_context = _remote_span_context(value)
    if span_context is None:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def _remote_span_context(value: bytes | str | None) -> SpanContext | None:
    # Runs per handled entry: a bytes pattern (no decode), the flags from a
    # table, SpanContext's positional form (its keyword form costs more).
    if value is None:
        return None
    raw = value if type(value) is bytes else str(value).encode("ascii", "replace")
    match = _TRACEPARENT.fullmatch(raw) or _TRACEPARENT.fullmatch(raw.strip())
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, True, _FLAGS[int(match[3], 16)])


class TracingMiddleware(Middleware):
    """A ``CONSUMER`` span per entry, child of the publisher's span.

    ``field`` is the entry field read for the ``traceparent`` (None: do not
    link).  ``tracer`` defaults to ``trace.get_tracer("streamkit")``.
    ``follow_parent_sampling``: an entry whose producer span was sampled out
    gets no span (see the module docstring); False asks the tracer every time.
    """

    def __init__(
        self,
        *,
        tracer: trace.Tracer | None = None,
        field: str | None = "traceparent",
        follow_parent_sampling: bool = True,
    ) -> None:
        # The default is a proxy: a provider installed later is still used.
        self.tracer = tracer or trace.get_tracer("streamkit")
        self.follow_parent_sampling = follow_parent_sampling
        self._explicit = tracer is not None
        self._field = field.encode() if field else None
        self._active = self._explicit
        self._recheck_at = -math.inf

    @property
    def active(self) -> bool:  # type: ignore[override]
        """Inactive while no tracer provider is installed: the chain skips it."""
        return self._tracing()

    def _tracing(self) -> bool:
        """Whether spans are worth starting: a tracer was given, or a provider is installed.

        Without an SDK a no-op span would still cost a context switch per
        entry.  ``get_tracer_provider()`` reads the environment while none is
        installed (a system call per check), so the answer is kept for a second: a provider
        installed later is used from the next check on.
        """
        if self._explicit:
            return True
        now = time.monotonic()
        if now >= self._recheck_at:
            self._active = not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)
            self._recheck_at = now + _RECHECK_S
        return self._active

    # Per entry: inline hooks, not a ``consume`` level (see streamkit.middleware):
    # the level's context object, partials and coroutine cost more than the
    # sampled-out case itself.

    def enter_consume(
        self, message: Message, stream_prefix: str, consumer_group: str, member_id: str
    ) -> object:
        field = self._field
        var = _CURRENT
        if field is not None and var is not None and self.follow_parent_sampling:
            # The common case, a producer sampling at the head, inside
            # consume_read: no span, no SDK call, no context built, the
            # producer's context parsed only if someone asks (_DeliverySpan).
            # The token is _DELIVERY_RAW's own.
            raw = message.raw_fields.get(field)
            if (  # _is_unsampled, inline (a call costs a tenth of it)
                type(raw) is bytes
                and raw[53:] == b"00"
                and raw.translate(_CLASSES) == _SHAPE
                and raw[:2] == b"00"
                and raw[3:35] != _ZERO_TRACE_ID
                and raw[36:52] != _ZERO_SPAN_ID
                and var.get().get(_SPAN_KEY) is _DELIVERY
            ):
                return _DELIVERY_RAW.set(raw)
        return self._enter(message, stream_prefix, consumer_group, member_id)

    def exit_consume(self, token: object, result: ConsumeResult | None) -> None:
        if type(token) is Token:
            try:
                _DELIVERY_RAW.reset(token)  # only the fast path makes one
            except ValueError:  # what the API's detach tolerates (and logs)
                log.exception("failed to restore the tracing context")
        elif type(token) is _Scope:
            token.close(result)

    def _enter(
        self, message: Message, stream_prefix: str, consumer_group: str, member_id: str
    ) -> _Scope:
        """Every other entry: sampled, without a ``traceparent``, or another runtime context."""
        parent = None
        if self._field is not None:
            raw = message.raw_fields.get(self._field)
            if self.follow_parent_sampling:
                unsampled = _unsampled_parent(raw)
                if unsampled is not None:
                    return _Scope(None, otel_context.attach(_with_parent(unsampled)))
            remote = _remote_span_context(raw)
            if remote is not None:
                parent = trace.set_span_in_context(NonRecordingSpan(remote))
                if self.follow_parent_sampling and not remote.trace_flags.sampled:
                    return _Scope(None, otel_context.attach(parent))
        # Attributes given at the start: an SDK span takes its lock once for
        # them, instead of once per set_attribute call.  start_span and a
        # context token rather than start_as_current_span: that one stacks
        # three generator context managers per entry.
        span = self.tracer.start_span(
            f"process {stream_prefix}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "redis",
                "messaging.operation.type": "process",
                "messaging.destination.name": message.stream_key,
                "messaging.consumer.group.name": consumer_group,
                "messaging.message.id": message.id,
                "streamkit.shard_index": message.shard,
                "streamkit.member_id": member_id,
                "streamkit.delivery_count": message.delivery_count,
            },
            record_exception=False,
            set_status_on_exception=False,
        )
        return _Scope(span, otel_context.attach(trace.set_span_in_context(span)))

    async def consume_read(self, ctx: ReadContext, call_next: ReadNext) -> list[ConsumeResult]:
        """Run a read's handlers under ``_DELIVERY``: one context switch per read,
        not one per sampled-out entry (see ``_DeliverySpan``)."""
        var = _CURRENT
        if self._field is None or var is None or not self.follow_parent_sampling:
            return await call_next()
        base = var.get()
        token = var.set(
            Context({**base, _SPAN_KEY: _DELIVERY}) if base else Context({_SPAN_KEY: _DELIVERY})
        )
        try:
            return await call_next()
        finally:
            var.reset(token)

    async def consume_batch(self, ctx: BatchContext, call_next: BatchNext) -> list[ConsumeResult]:
        if not self._tracing():
            return await call_next()
        links: list[Link] = []
        if self._field is not None:
            for message in ctx.messages:
                parent = _remote_span_context(message.raw_fields.get(self._field))
                if parent is not None:
                    links.append(Link(parent))
        with self.tracer.start_as_current_span(
            f"process {ctx.stream_prefix}",
            kind=SpanKind.CONSUMER,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if span.is_recording():
                span.set_attribute("messaging.system", "redis")
                span.set_attribute("messaging.operation.type", "process")
                span.set_attribute("messaging.destination.name", ctx.messages[0].stream_key)
                span.set_attribute("messaging.consumer.group.name", ctx.consumer_group)
                span.set_attribute("messaging.batch.message_count", len(ctx.messages))
                span.set_attribute("streamkit.shard_index", ctx.shard)
                span.set_attribute("streamkit.member_id", ctx.member_id)
            results = await call_next()
            if span.is_recording():
                decisions = [(r.decision, r.error) for r in results if r.decision is not None]
                if decisions:
                    decision, error = decisions[0]
                    span.set_attribute("streamkit.failed_count", len(decisions))
                    if error is not None:
                        span.record_exception(error)
                    span.set_status(Status(StatusCode.ERROR, decision.error))
            return results
