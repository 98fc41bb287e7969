"""OpenTelemetry spans: one per publish, one per publish_many batch.

The SDK is a test-only dependency; the library itself uses the API alone. A
private provider is handed to the publisher, so the global one is untouched.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamkit.publisher.publisher import Publisher, StaleRouteError
from streamkit.routing import shard_for_key

from .conftest import Stack


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def traced(stack: Stack, exporter: InMemorySpanExporter) -> Publisher:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pub = stack.publisher()
    pub.tracer = provider.get_tracer("streamkit")
    return pub


async def test_one_span_per_publish(stack: Stack, exporter: InMemorySpanExporter) -> None:
    await stack.create_group(8)
    pub = traced(stack, exporter)
    result = await pub.publish("order-123", {"a": 1})
    (span,) = exporter.get_finished_spans()
    assert span.name == f"publish {stack.prefix}"
    assert span.kind is SpanKind.PRODUCER
    assert dict(span.attributes or {}) == {
        "messaging.system": "redis",
        "messaging.operation.type": "send",
        "messaging.destination.name": result.stream_key,
        "streamkit.shard_index": 5,
        "streamkit.metadata_version": 1,
    }
    assert span.status.status_code is StatusCode.UNSET


async def test_one_span_per_batch(stack: Stack, exporter: InMemorySpanExporter) -> None:
    await stack.create_group(4)
    pub = traced(stack, exporter)
    pub.max_batch = 10
    await pub.publish_many([(f"k{i}", {"i": i}) for i in range(25)])
    spans = exporter.get_finished_spans()
    assert [s.attributes["messaging.batch.message_count"] for s in spans] == [10, 10, 5]  # type: ignore[index]
    for span in spans:
        assert span.attributes is not None
        assert span.attributes["messaging.destination.name"] == stack.prefix
        assert span.attributes["streamkit.metadata_version"] == 1


async def test_failed_publish_span_records_the_error(
    stack: Stack, exporter: InMemorySpanExporter
) -> None:
    await stack.create_group(4)
    pub = traced(stack, exporter)
    await pub.start()
    await stack.redis.delete(stack.key(shard_for_key("k", 4)))
    with pytest.raises(StaleRouteError):
        await pub.publish("k", {"a": 1})
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
