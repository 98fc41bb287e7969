"""Middlewares around consume and publish, against real Redis and a real coordinator:
the failure policy's decision is what they see, the chain's order, short-circuits,
the OpenTelemetry parent/child link across a real publish -> consume, and the
Prometheus middleware's counts."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from streamkit import Message
from streamkit.consumer.failure import FailurePolicy
from streamkit.middleware import (
    BatchContext,
    BatchNext,
    ConsumeContext,
    ConsumeNext,
    ConsumeResult,
    Middleware,
    PublishContext,
    PublishNext,
    ReadContext,
    ReadNext,
)
from streamkit.observability.metrics import AppCollector, PrometheusMiddleware
from streamkit.observability.tracing import TracingMiddleware, parent_context
from streamkit.publisher.publisher import PublishResult

from .support import Admin, InProcessApp, eventually, serving

# One Redis flavour is enough here: the chain sits above the Redis commands.
standalone = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


class Recorder(Middleware):
    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        self.name = name
        self.log = log

    async def consume(self, ctx: ConsumeContext, call_next: ConsumeNext) -> ConsumeResult:
        self.log.append((self.name, "in", ctx.message.fields["n"]))
        result = await call_next()
        self.log.append((self.name, result.outcome.value, ctx.message.fields["n"]))
        return result

    async def publish(self, ctx: PublishContext, call_next: PublishNext) -> PublishResult:
        ctx.fields = {**ctx.fields, f"via-{self.name}": "1"}
        return await call_next()


class SkipSeen(Middleware):
    """A short-circuit: entries marked ``dup`` are acked without the handler."""

    async def consume(self, ctx: ConsumeContext, call_next: ConsumeNext) -> ConsumeResult:
        if "dup" in ctx.message.fields:
            ctx.message.ack()
            return ConsumeResult()
        return await call_next()


@standalone
async def test_middlewares_wrap_handler_and_policy_in_order(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    log: list[tuple[str, ...]] = []
    app = make_app("mw", middlewares=[Recorder("outer", log), Recorder("inner", log)])
    app.add_middleware(SkipSeen())
    pub = app.publisher(stream_prefix=prefix, group=group)
    handled: list[dict[str, str]] = []
    policy = FailurePolicy(max_attempts=2, backoff_initial_ms=10, jitter=0.0)

    @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy)
    async def handle(msg: Message) -> None:
        handled.append(msg.fields)
        if msg.fields["n"] == "bad":
            raise RuntimeError("boom")
        await msg.ack()

    with anyio.fail_after(20):
        async with serving(app):
            for n in ("a", "bad", "dup", "b"):
                await pub.publish("k", {"n": n, **({"dup": "1"} if n == "dup" else {})})
            await eventually(lambda: ("outer", "acked", "b") in log, 10, "every entry")
    outer = [(o, n) for who, o, n in log if who == "outer" and o != "in"]
    assert outer == [
        ("acked", "a"),
        ("retried", "bad"),
        ("dead_lettered", "bad"),
        ("acked", "dup"),
        ("acked", "b"),
    ]
    # First middleware is the outermost: it enters first and leaves last.
    assert log[:4] == [("outer", "in", "a"), ("inner", "in", "a"), ("inner", "acked", "a"),
                       ("outer", "acked", "a")]  # fmt: skip
    assert [h["n"] for h in handled] == ["a", "bad", "bad", "b"]  # "dup" never reached it
    # Publish middlewares changed the fields, outer first.
    assert all(h["via-outer"] == "1" and h["via-inner"] == "1" for h in handled)


class ReadRecorder(Middleware):
    """Logs each read's entries and the results of its handler calls, around
    the per-entry middlewares (a ``consume`` of its own counts them)."""

    def __init__(self) -> None:
        self.reads: list[tuple[list[str], list[tuple[str, str]]]] = []
        self.entered = 0

    async def consume_read(self, ctx: ReadContext, call_next: ReadNext) -> list[ConsumeResult]:
        names = [m.fields["n"] for m in ctx.messages]
        assert all(m.shard == ctx.shard for m in ctx.messages)
        entered = self.entered
        results = await call_next()
        # Every handler call of this read went through consume inside it.
        assert self.entered - entered == len(results)
        outcomes = [(r.message.fields["n"], r.outcome.value) for r in results if r.message]
        self.reads.append((names, outcomes))
        return results

    async def consume(self, ctx: ConsumeContext, call_next: ConsumeNext) -> ConsumeResult:
        self.entered += 1
        return await call_next()


@standalone
@pytest.mark.parametrize("ordered", [True, False])
async def test_read_middleware_sees_every_handler_call_of_a_read(
    admin: Admin,
    names: tuple[str, str],
    ordered: bool,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    recorder = ReadRecorder()
    app = make_app("read", middlewares=[recorder])
    pub = app.publisher(stream_prefix=prefix, group=group)
    policy = FailurePolicy(max_attempts=2, backoff_initial_ms=10, jitter=0.0)

    @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy, ordered=ordered)
    async def handle(msg: Message) -> None:
        if msg.fields["n"] == "bad":
            raise RuntimeError("boom")

    with anyio.fail_after(20):
        # Published before the member starts: one read finds all three.
        await pub.publish_many([("k", {"n": n}) for n in ("a", "bad", "b")])
        async with serving(app):
            await eventually(
                lambda: any(("bad", "dead_lettered") in o for _, o in recorder.reads),
                10,
                "the dead letter",
            )
    if ordered:
        # Retried in place: the retry is part of the same read.
        assert recorder.reads == [
            (
                ["a", "bad", "b"],
                [("a", "acked"), ("bad", "retried"), ("bad", "dead_lettered"), ("b", "acked")],
            )
        ]
    else:
        # Parked: the retry comes back in a read of its own.
        first, second = recorder.reads
        assert first[0] == ["a", "bad", "b"]
        assert sorted(first[1]) == [("a", "acked"), ("b", "acked"), ("bad", "retried")]
        assert second == (["bad"], [("bad", "dead_lettered")])


def recording() -> tuple[InMemorySpanExporter, TracerProvider]:
    """A private SDK provider that keeps every finished span (the global one is untouched)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


@standalone
async def test_consumer_span_is_child_of_the_producer_span(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    exporter, provider = recording()
    tracer = provider.get_tracer("streamkit")
    app = make_app("trace", middlewares=[TracingMiddleware(tracer=tracer)])
    pub = app.publisher(stream_prefix=prefix, group=group)
    pub.tracer = tracer
    seen: list[str] = []

    @app.stream_listener(stream_prefix=prefix, group=group, auto_ack=True)
    async def handle(msg: Message) -> None:
        seen.append(msg.fields["traceparent"])

    with anyio.fail_after(20):
        async with serving(app):
            await pub.publish("order-1", {"n": "1"})
            await pub.publish_many([("order-2", {"n": "2"}), ("order-3", {"n": "3"})])
            await eventually(lambda: len(seen) == 3, 10, "three entries handled")
            await eventually(
                lambda: (
                    sum(s.kind is SpanKind.CONSUMER for s in exporter.get_finished_spans()) == 3
                ),
                5,
                "three consumer spans",
            )
    spans = exporter.get_finished_spans()
    producers = {s.context.span_id: s for s in spans if s.kind is SpanKind.PRODUCER}
    consumers = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert len(producers) == 2  # one per publish, one per publish_many batch
    for span in consumers:
        assert span.parent is not None
        producer = producers[span.parent.span_id]
        assert span.context.trace_id == producer.context.trace_id
        assert span.name == f"process {prefix}"
        assert span.attributes is not None
        assert span.attributes["streamkit.outcome"] == "acked"
        assert span.attributes["messaging.consumer.group.name"] == group
        assert span.status.status_code is StatusCode.UNSET
    # A missing or malformed traceparent starts a new trace instead of failing.
    assert parent_context(None) is None and parent_context("garbage") is None


@standalone
@pytest.mark.parametrize("follow", [True, False])
async def test_a_sampled_out_producer_decides_for_the_consumer(
    admin: Admin,
    names: tuple[str, str],
    follow: bool,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    producer_side = TracerProvider(sampler=ALWAYS_OFF)  # every producer span sampled out
    # Consumer side: a sampler that records everything it is asked about, so
    # a consumer span appears exactly when the middleware asks the SDK.
    exporter = InMemorySpanExporter()
    consumer_side = TracerProvider(sampler=ALWAYS_ON)
    consumer_side.add_span_processor(SimpleSpanProcessor(exporter))
    app = make_app(
        f"sampled-{follow}",
        middlewares=[
            TracingMiddleware(
                tracer=consumer_side.get_tracer("streamkit"), follow_parent_sampling=follow
            )
        ],
    )
    pub = app.publisher(stream_prefix=prefix, group=group)
    pub.tracer = producer_side.get_tracer("streamkit")
    seen: list[tuple[str, trace.SpanContext]] = []

    @app.stream_listener(stream_prefix=prefix, group=group, auto_ack=True)
    async def handle(msg: Message) -> None:
        seen.append((msg.fields["traceparent"], trace.get_current_span().get_span_context()))

    with anyio.fail_after(20):
        async with serving(app):
            await pub.publish("order-1", {"n": "1"})
            await pub.publish_many([("order-2", {"n": "2"})])
            await eventually(lambda: len(seen) == 2, 10, "two entries handled")
    for value, current in seen:
        # The publisher wrote the sampled-out decision into the entry.
        version, trace_id, span_id, flags = value.split("-")
        assert version == "00" and int(flags, 16) & 1 == 0  # not sampled
        assert current.trace_id == int(trace_id, 16)  # the handler ran in that trace
        if follow:
            # No consumer span: the handler sees the producer's unsampled span.
            assert current.span_id == int(span_id, 16) and not current.trace_flags.sampled
    consumers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    if follow:
        assert consumers == []
    else:  # asked every time: the consumer's own sampler recorded both
        assert len(consumers) == 2
        assert {s.parent.span_id for s in consumers if s.parent} == {
            int(value.split("-")[2], 16) for value, _ in seen
        }


@standalone
async def test_prometheus_middleware_counts_outcomes_and_publishes(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    registry = CollectorRegistry()
    app = make_app("prom", middlewares=[PrometheusMiddleware(registry)])
    registry.register(AppCollector(app))
    pub = app.publisher(stream_prefix=prefix, group=group)
    policy = FailurePolicy(max_attempts=1)

    @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy)
    async def handle(msg: Message) -> None:
        if msg.fields["n"] == "bad":
            raise ValueError("no")
        await msg.ack()

    labels = {"stream_prefix": prefix, "group": group}

    def value(name: str, **extra: str) -> float:
        return registry.get_sample_value(name, {**labels, **extra}) or 0.0

    with anyio.fail_after(20):
        async with serving(app):
            await pub.publish_many([(f"k{i}", {"n": str(i)}) for i in range(5)])
            await pub.publish("k", {"n": "bad"})
            await eventually(
                lambda: (
                    value("streamkit_consumer_entries_handled_total", outcome="dead_lettered") == 1
                    and value("streamkit_consumer_entries_handled_total", outcome="acked") == 5
                ),
                10,
                "six outcomes",
            )
            owned = sum(
                registry.get_sample_value(
                    "streamkit_member_owned_shards", {**labels, "member": m.member_id}
                )
                or 0
                for m in app.members
            )
            assert owned == 2
            for m in app.members:
                member = {"member": m.member_id}
                assert value("streamkit_member_state", **member, state="stable") == 1
                assert value("streamkit_member_state", **member, state="joining") == 0
                assert value("streamkit_member_heartbeat_duration_seconds_count", **member) >= 1
                assert value("streamkit_member_heartbeat_duration_seconds_sum", **member) > 0
                assert value("streamkit_member_heartbeat_failures_total", **member) == 0
                assert value("streamkit_consumer_poll_duration_seconds_count", **member) >= 1
    assert value("streamkit_consumer_entries_received_total") == 6
    assert value("streamkit_publish_messages_total") == 6
    assert value("streamkit_publish_duration_seconds_count") == 2
    assert value("streamkit_consumer_handler_duration_seconds_count") == 6
    assert value("streamkit_consumer_in_flight") == 0
    assert value("streamkit_publish_routing_refreshes_total") >= 1  # the start-up fetch
    assert value("streamkit_publish_retries_total") == 0


def test_publish_error_reasons_are_bounded() -> None:
    from streamkit.observability.metrics import error_reason
    from streamkit.publisher.routing_cache import RoutingUnavailable

    assert error_reason(TypeError("x")) == "invalid_fields"
    assert error_reason(ConnectionError()) == "connection"
    assert error_reason(RoutingUnavailable("gone", "lease_expired")) == "routing_unavailable"
    assert error_reason(KeyError("k")) == "other"


class BatchRecorder(Middleware):
    def __init__(self) -> None:
        self.batches: list[tuple[int, list[str]]] = []

    async def consume_batch(self, ctx: BatchContext, call_next: BatchNext) -> list[ConsumeResult]:
        results = await call_next()
        self.batches.append((ctx.shard, [r.outcome.value for r in results]))
        return results


@standalone
async def test_batch_middleware_sees_one_outcome_per_entry(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    recorder = BatchRecorder()
    registry = CollectorRegistry()
    app = make_app("batch", middlewares=[recorder, PrometheusMiddleware(registry)])
    pub = app.publisher(stream_prefix=prefix, group=group)
    policy = FailurePolicy(max_attempts=1)

    @app.stream_listener(stream_prefix=prefix, group=group, failure_policy=policy, batch_size=10)
    async def handle(msgs: list[Message]) -> None:
        for msg in msgs:
            # A nack is a failure; with one attempt allowed it is dead-lettered.
            await (msg.nack() if int(msg.fields["n"]) % 2 else msg.ack())

    with anyio.fail_after(20):
        await pub.publish_many([("k", {"n": str(i)}) for i in range(4)])
        async with serving(app):
            await eventually(
                lambda: sum(len(o) for _, o in recorder.batches) == 4, 10, "four outcomes"
            )
    outcomes = [o for _, batch in recorder.batches for o in batch]
    assert outcomes == ["acked", "dead_lettered", "acked", "dead_lettered"]

    # The metrics count a batch's outcomes per entry and time each handler call once.
    def value(name: str, **extra: str) -> float:
        labels = {"stream_prefix": prefix, "group": group, **extra}
        return registry.get_sample_value(name, labels) or 0.0

    assert value("streamkit_consumer_entries_received_total") == 4
    assert value("streamkit_consumer_entries_handled_total", outcome="acked") == 2
    assert value("streamkit_consumer_entries_handled_total", outcome="dead_lettered") == 2
    calls = len(recorder.batches)
    assert value("streamkit_consumer_handler_duration_seconds_count") == calls
    assert value("streamkit_consumer_in_flight") == 0


@standalone
async def test_batch_span_links_every_producer_and_debug_spans_cover_heartbeats_and_reads(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    exporter, provider = recording()
    tracer = provider.get_tracer("streamkit")
    app = make_app(
        "batchspan",
        middlewares=[TracingMiddleware(tracer=tracer)],
        debug_tracer=provider.get_tracer("streamkit.debug"),
    )
    pub = app.publisher(stream_prefix=prefix, group=group)
    pub.tracer = tracer
    handled: list[int] = []

    @app.stream_listener(stream_prefix=prefix, group=group, batch_size=10, auto_ack=True)
    async def handle(msgs: list[Message]) -> None:
        handled.append(len(msgs))

    with anyio.fail_after(20):
        await pub.publish("a", {"n": "1"})
        await pub.publish("b", {"n": "2"})
        async with serving(app):
            await eventually(lambda: sum(handled) == 2, 10, "two entries handled")
            member_id = app.members[0].member_id
    spans = exporter.get_finished_spans()
    producers = {s.context.span_id for s in spans if s.kind is SpanKind.PRODUCER}
    batches = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert len(producers) == 2 and len(batches) == len(handled)
    linked = {link.context.span_id for s in batches for link in s.links}
    assert linked == producers  # a batch has many parents: links, not a parent
    assert all(s.parent is None for s in batches)
    assert sum(s.attributes["messaging.batch.message_count"] for s in batches) == 2  # type: ignore[index,misc]
    beats = [s for s in spans if s.name == "streamkit heartbeat"]
    polls = [s for s in spans if s.name == "streamkit poll"]
    assert beats and all(s.kind is SpanKind.CLIENT for s in beats)
    assert beats[0].attributes["streamkit.member_id"] == member_id  # type: ignore[index]
    assert polls and {s.attributes["streamkit.shard_index"] for s in polls} == {0}  # type: ignore[index]
    assert sum(s.attributes["messaging.batch.message_count"] for s in polls) >= 2  # type: ignore[index,misc]
