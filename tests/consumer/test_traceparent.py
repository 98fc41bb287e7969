"""The lean path for sampled-out producers agrees with the full ``traceparent`` parse."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry import trace

from streamkit.observability.tracing import _remote_span_context, _unsampled_parent


def _hex(size: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdefABCDEF", min_size=size, max_size=size)


well_formed = st.builds(
    lambda trace_id, span_id, flags: f"00-{trace_id}-{span_id}-{flags}",
    _hex(32) | st.just("0" * 32),
    _hex(16) | st.just("0" * 16),
    st.sampled_from(["00", "01", "02", "03", "ff", "0g"]),
)
# Near misses: padding, cut or stretched values, other versions, stray bytes.
mangled = st.builds(
    lambda value, pad, cut: (pad + value + pad)[: len(value) + cut] if cut else pad + value,
    well_formed,
    st.sampled_from(["", " ", "\t"]),
    st.integers(-3, 3),
)
values = (well_formed | mangled).map(str.encode) | st.binary(max_size=60)


@given(values)
@example(b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-00")
@example(b"00-" + b"0" * 32 + b"-" + b"b" * 16 + b"-00")
@example(b"00-" + b"a" * 32 + b"-" + b"0" * 16 + b"-00")
@example(b"01-" + b"a" * 32 + b"-" + b"b" * 16 + b"-00")
def test_the_lazy_parent_is_the_full_parse_of_an_unsampled_traceparent(raw: bytes) -> None:
    full = _remote_span_context(raw)
    lazy = _unsampled_parent(raw)
    if lazy is None:
        # Only an exact, valid, unsampled value must take the lean path; the
        # rest (padded, flags other than 00) is the full parse's to decide.
        exact = len(raw) == 55 and raw.endswith(b"-00") and raw == raw.strip()
        assert not (exact and full is not None and full.trace_flags == 0)
        return
    assert full is not None and not full.trace_flags.sampled
    context = lazy.get_span_context()
    assert context == full and context.is_remote and context.is_valid
    assert not lazy.is_recording()
    # What a child span or a propagator reads from the handler's context.
    assert trace.get_current_span(trace.set_span_in_context(lazy)).get_span_context() == full
    assert repr(lazy) == f"NonRecordingSpan({full!r})"


def test_the_parent_context_is_what_the_api_builds() -> None:
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    from streamkit.observability.tracing import _with_parent

    span = _unsampled_parent(b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-00")
    assert span is not None
    # On an empty context (a poller's) and on one carrying other values: the
    # same context the API's set_span_in_context builds, values kept.
    for base in (otel_context.Context(), baggage.set_baggage("tenant", "t1")):
        token = otel_context.attach(base)
        try:
            built = _with_parent(span)
            assert built == trace.set_span_in_context(span)
            assert trace.get_current_span(built) is span
            assert baggage.get_all(built) == baggage.get_all(base)
        finally:
            otel_context.detach(token)


def traced_invoker(handler: Any) -> tuple[Any, Any]:
    """A real Invoker whose only middleware traces to a private SDK provider
    that keeps every finished span: (invoker, exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from streamkit.consumer.invoke import Invoker
    from streamkit.consumer.options import PollerOptions
    from streamkit.observability import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    invoker = Invoker(
        stream_prefix="s", consumer_group="g", member_id="m", options=PollerOptions(),
        handler=handler, batch_handler=None,
        middlewares=[tracing.TracingMiddleware(tracer=provider.get_tracer("t"))],
    )  # fmt: skip
    return invoker, exporter


async def handle_read(invoker: Any, messages: list[Any]) -> list[Any]:
    """One read through the invoker, as the dispatcher runs it: the active
    ``consume_read`` levels around the entries, handled one by one."""
    from functools import partial

    from streamkit.middleware import Chain

    async def entries(results: list[Any]) -> list[Any]:
        for message in messages:
            results.append(await invoker.invoke(message))
        return results

    levels = invoker.begin_read()
    if not levels:
        return await entries([])
    return list(await Chain.run(levels, invoker.read_context(messages), partial(entries, [])))


async def test_the_fast_path_runs_the_handler_in_the_producers_unsampled_context() -> None:
    """TracingMiddleware's read level and inline hooks, run by a real Invoker:
    on the common path (one context for the read, each entry's value in a
    ContextVar of streamkit's) the handler sees the producer's span context,
    with baggage kept, no span is started, and the caller's context is back
    afterwards; a sampled producer gets a consumer span."""
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    from streamkit.consumer.message import Message
    from streamkit.observability import tracing

    assert tracing._CURRENT is not None  # the default runtime context: the fast path is on
    seen: dict[str, object] = {}

    async def handler(message: Message) -> None:
        span = trace.get_current_span()
        seen["context"] = span.get_span_context()
        seen["recording"] = span.is_recording()
        seen["tenant"] = baggage.get_baggage("tenant")
        message.ack()

    invoker, exporter = traced_invoker(handler)

    raw = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-00"
    token = otel_context.attach(baggage.set_baggage("tenant", "t1"))
    try:
        before = otel_context.get_current()
        (result,) = await handle_read(invoker, [Message(_Sink(), 0, b"1-1", {b"traceparent": raw})])
        assert otel_context.get_current() is before and result.decision is None
    finally:
        otel_context.detach(token)
    assert seen["context"] == _remote_span_context(raw)
    assert seen["recording"] is False and seen["tenant"] == "t1"
    # Entries of one read, one after the other: each sees its own producer
    # (two of one publish_many share a value), now outside the baggage.
    other = b"00-" + b"c" * 32 + b"-" + b"d" * 16 + b"-00"
    contexts = []

    async def recording_handler(message: Message) -> None:
        await handler(message)
        contexts.append((seen["context"], seen["tenant"]))

    invoker, exporter = traced_invoker(recording_handler)
    values = [raw, raw, other, raw]
    await handle_read(
        invoker, [Message(_Sink(), 0, b"1-3", {b"traceparent": value}) for value in values]
    )
    assert contexts == [(_remote_span_context(value), None) for value in values]
    assert exporter.get_finished_spans() == ()
    # A sampled producer still gets its consumer span, through the full path.
    sampled = Message(_Sink(), 0, b"1-2", {b"traceparent": raw[:-2] + b"01"})
    await handle_read(invoker, [sampled])
    (span,) = exporter.get_finished_spans()
    assert span.parent is not None and span.parent.span_id == int("b" * 16, 16)
    assert span.attributes is not None and span.attributes["streamkit.outcome"] == "acked"
    assert seen["recording"] is True


class _Sink:
    stream_key = "s:0"
    consumer_group = "g"
    member_id = "m"

    def settle(self, raw_id: bytes, how: object) -> None:
        pass


@given(values)
@example(b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-00")
@example(b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01")
@example(b"00-" + b"0" * 32 + b"-" + b"b" * 16 + b"-00")
@example(b"00-" + b"A" * 32 + b"-" + b"b" * 16 + b"-00")
@example(b"00-" + b"a" * 32 + b"_" + b"b" * 16 + b"-00")
def test_the_inline_fast_path_is_taken_exactly_for_an_exact_unsampled_value(raw: bytes) -> None:
    """``enter_consume`` keeps its own copy of ``_is_unsampled`` (inline, it
    runs per entry): inside a read it takes the lean path (a bare ContextVar
    token) exactly when that says so, and whatever path it takes the handler
    sees the full parse's decision."""
    import asyncio
    from contextvars import Token

    from opentelemetry import context as otel_context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from streamkit.consumer.message import Message
    from streamkit.middleware import ReadContext
    from streamkit.observability.tracing import TracingMiddleware, _is_unsampled

    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # records every span it is asked for
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    middleware = TracingMiddleware(tracer=provider.get_tracer("t"))
    message = Message(_Sink(), 0, b"1-1", {b"traceparent": raw})

    async def one_entry() -> list[Any]:
        nonlocal token, seen, recording
        token = middleware.enter_consume(message, "s", "g", "m")
        try:
            span = trace.get_current_span()
            seen, recording = span.get_span_context(), span.is_recording()
        finally:
            middleware.exit_consume(token, None)
        return []

    async def read() -> None:
        before = otel_context.get_current()
        await middleware.consume_read(ReadContext([message], "s", "g", "m"), one_entry)
        assert otel_context.get_current() is before

    token: object = None
    seen: trace.SpanContext | None = None
    recording = False
    asyncio.run(read())
    assert (type(token) is Token) == _is_unsampled(raw)
    full = _remote_span_context(raw)
    if full is not None and not full.trace_flags.sampled:
        # The producer's sampled-out span: no consumer span, its context seen.
        assert seen == full and not recording and exporter.get_finished_spans() == ()
        return
    (consumer,) = exporter.get_finished_spans()
    assert recording and seen == consumer.context
    # A child of a sampled producer; a new trace for an absent or malformed value.
    assert consumer.parent == full


@pytest.mark.parametrize("in_read", [True, False], ids=["in a read", "alone"])
@pytest.mark.parametrize("runtime", ["default", "another"])
async def test_what_the_handler_sees_for_each_kind_of_entry(
    runtime: str, in_read: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real Invoker, with the API's default runtime context (inside
    a read, the lean path) and with another one, as chosen with
    ``OTEL_PYTHON_CONTEXT`` (everything goes through the API), in a read and
    alone (a parked entry's retry runs outside one): a sampled-out producer,
    a sampled one, no ``traceparent`` and a malformed one.  The handler sees
    the same in every case, and the caller's context is back."""
    from opentelemetry import context as otel_context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    from streamkit.consumer.message import Message
    from streamkit.observability import tracing

    if runtime == "another":

        class Another(ContextVarsRuntimeContext):
            """A runtime context of its own (not the API's default class)."""

        monkeypatch.setattr(otel_context, "_RUNTIME_CONTEXT", Another())
        monkeypatch.setattr(tracing, "_CURRENT", tracing._current_context_var())
        assert tracing._CURRENT is None
    else:
        assert tracing._CURRENT is not None
    seen: list[tuple[trace.SpanContext, bool]] = []

    async def handler(message: Message) -> None:
        span = trace.get_current_span()
        seen.append((span.get_span_context(), span.is_recording()))

    invoker, exporter = traced_invoker(handler)
    unsampled = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-00"
    sampled = unsampled[:-2] + b"01"
    malformed = unsampled[:-3] + b"_00"  # the right length, a stray byte
    invoker.begin_read()
    before = otel_context.get_current()
    for fields in (
        {b"traceparent": unsampled},
        {b"traceparent": sampled},
        {},
        {b"traceparent": malformed},
    ):
        message = Message(_Sink(), 0, b"1-1", fields)
        await (handle_read(invoker, [message]) if in_read else invoker.invoke(message))
        assert otel_context.get_current() is before
    spans = exporter.get_finished_spans()
    # The sampled-out producer's own context, not recording, no consumer span.
    assert seen[0] == (_remote_span_context(unsampled), False)
    assert len(spans) == 3 and all(s.name == "process s" for s in spans)
    # A sampled producer: a consumer span, its child.
    assert seen[1] == (spans[0].context, True)
    assert spans[0].parent == _remote_span_context(sampled)
    # No traceparent, or a malformed one: a consumer span in a new trace.
    for (context, recording), span in zip(seen[2:], spans[1:], strict=True):
        assert recording and context == span.context and span.parent is None


async def test_a_task_the_handler_starts_keeps_its_entrys_trace() -> None:
    """The read's context holds one span for every sampled-out entry, which
    reads the entry from a ContextVar: a task started by a handler copies it,
    so it still sees its own entry's producer after the handler returned and
    later entries ran; between entries the span names no parent."""
    import asyncio

    from streamkit.consumer.message import Message

    started: list[asyncio.Task[trace.SpanContext]] = []
    gate = asyncio.Event()
    between: list[trace.SpanContext] = []

    async def later() -> trace.SpanContext:
        await gate.wait()
        return trace.get_current_span().get_span_context()

    async def handler(message: Message) -> None:
        started.append(asyncio.get_running_loop().create_task(later()))

    invoker, exporter = traced_invoker(handler)
    values = [b"00-" + bytes([c]) * 32 + b"-" + b"b" * 16 + b"-00" for c in b"abc"]
    messages = [Message(_Sink(), 0, b"1-1", {b"traceparent": value}) for value in values]

    async def handle_then_look(results: list[Any]) -> list[Any]:
        for message in messages:
            results.append(await invoker.invoke(message))
            between.append(trace.get_current_span().get_span_context())
        return results

    from streamkit.middleware import Chain

    levels = invoker.begin_read()
    await Chain.run(levels, invoker.read_context(messages), lambda: handle_then_look([]))
    gate.set()
    assert [await task for task in started] == [_remote_span_context(v) for v in values]
    assert between == [trace.INVALID_SPAN_CONTEXT] * 3
    assert exporter.get_finished_spans() == ()
