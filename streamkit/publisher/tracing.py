"""The publisher's ``PRODUCER`` spans: a middleware around each send.

A send is one ``publish``, or one pipeline of ``publish_many`` (up to
``max_batch`` messages).  :class:`ProducerTracing` wraps it the way a
:class:`~streamkit.middleware.Middleware` wraps a call: it starts the span,
writes the span's W3C ``traceparent`` into every entry of the send (also when
the span is sampled out: the flags carry the decision to the consumer), runs
the send and records where it went.  It sits innermost, after the fields were
checked, so the ``traceparent`` is added to what is actually written; the
user's publish middlewares (``streamkit.middleware``) wrap it.

Only the OpenTelemetry API is used.  Without a tracer provider nothing is
traced at all (``enabled`` is False and the publisher calls straight through).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from streamkit.results import PublishResult

__all__ = ["ProducerTracing", "SendContext", "global_tracing", "traceparent"]

_TRACER: Final = trace.get_tracer("streamkit")


@dataclass(slots=True)
class SendContext:
    """One send: the entries at ``pending`` of ``entries`` are sent together.

    ``entries`` are ``(partition_key, XADD field arguments)``; a middleware
    may add fields to them; ``results`` is filled in by the send, per index.
    """

    entries: list[tuple[Any, list[Any]]]
    pending: Sequence[int]
    results: list[PublishResult | None]
    #: One ``publish`` (its errors raise) rather than a pipeline of ``publish_many``.
    single: bool = False


#: Runs the send; returns the routing version it used (-1: none).
SendNext = Callable[[], Awaitable[int]]


class ProducerTracing:
    """Span set-up of one publisher, for single and batch sends alike."""

    def __init__(self, stream_prefix: str, trace_context_field: str | None) -> None:
        self.stream_prefix = stream_prefix
        self.span_name = f"publish {stream_prefix}"
        #: Entry field carrying the ``traceparent`` (None: not written).
        self.trace_context_field = trace_context_field
        self._tracer: trace.Tracer = _TRACER
        #: Whether to start spans at all (a tracer was set, or a provider is installed).
        self.enabled = global_tracing()

    @property
    def tracer(self) -> trace.Tracer:
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self.enabled = True

    def recheck(self) -> None:
        """Notice a tracer provider installed since (not on the hot path: it
        reads the environment; the publisher calls it from its slow path, at
        least once per routing refresh interval)."""
        if self._tracer is _TRACER:
            self.enabled = global_tracing()

    async def send(self, ctx: SendContext, call_next: SendNext) -> None:
        """Run ``call_next()`` inside this send's span."""
        span = self._tracer.start_span(self.span_name, kind=SpanKind.PRODUCER)
        if self.trace_context_field and span.get_span_context().is_valid:
            # Also when sampled out: the entries carry the decision (flags 00),
            # so consumers follow it instead of each sampling on their own.
            extra = (self.trace_context_field, traceparent(span))
            entries = ctx.entries
            for i in ctx.pending:
                key, args = entries[i]
                entries[i] = (key, [*args, *extra])
        if not span.is_recording():
            await call_next()
            return
        with trace.use_span(span, end_on_exit=True):
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.operation.type", "send")
            if not ctx.single:
                span.set_attribute("messaging.destination.name", self.stream_prefix)
                span.set_attribute("messaging.batch.message_count", len(ctx.pending))
            version = await call_next()
            result = ctx.results[ctx.pending[0]] if ctx.single else None
            if result is not None:
                span.set_attribute("messaging.destination.name", result.stream_key)
                span.set_attribute("streamkit.shard_index", result.shard_index)
                span.set_attribute("streamkit.metadata_version", result.metadata_version)
            elif not ctx.single and version >= 0:
                span.set_attribute("streamkit.metadata_version", version)


def traceparent(span: trace.Span) -> str:
    """The W3C ``traceparent`` header value naming ``span`` as the parent."""
    ctx = span.get_span_context()
    # The flags from a table: one publish in a sampling service pays this on
    # every call, sampled or not (an int() and a format less).
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{_FLAG_TEXT[ctx.trace_flags]}"


_FLAG_TEXT = tuple(f"{flags:02x}" for flags in range(256))


def global_tracing() -> bool:
    """Whether a real tracer provider is installed globally."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
