"""Counts and timings of a member's round trips, read at scrape time.

The heartbeat loop and the poller's reads are timed here rather than with
Prometheus objects: a count and a sum per member cost two additions, the
metrics collector turns them into summaries when it is scraped, and the
consumer side needs no ``prometheus-client``.  With ``STREAMKIT_TRACE_DEBUG``
on, each round trip also gets a span (the OpenTelemetry analogue of a debug
log level: off by default, one span per read is a lot of spans).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from streamkit.consumer.options import ReadObserver

__all__ = ["ReadTimer", "Timing", "debug_tracer", "end_span"]


@dataclass(slots=True)
class Timing:
    """How many round trips of one kind finished, their total time, and how many failed."""

    count: int = 0
    seconds: float = 0.0
    failures: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds


def debug_tracer(enabled: bool) -> trace.Tracer | None:
    """The tracer of debug spans (heartbeats, reads), or None when they are off."""
    return trace.get_tracer("streamkit.debug") if enabled else None


class ReadTimer:
    """The read observer of one member's poller: times every read (poll
    latency), opens a debug span per read, and passes the calls on."""

    def __init__(self, inner: ReadObserver | None = None, tracer: trace.Tracer | None = None):
        self.timing = Timing()
        self._inner = inner
        self._tracer = tracer
        # One read at a time per shard (one read loop per shard).
        self._started: dict[int, tuple[float, trace.Span | None]] = {}

    def read_started(self, shard: int, member_id: str, epoch: int) -> None:
        span = None
        if self._tracer is not None:
            span = self._tracer.start_span("streamkit poll", kind=SpanKind.CLIENT)
            if span.is_recording():
                span.set_attribute("streamkit.shard_index", shard)
                span.set_attribute("streamkit.member_id", member_id)
                span.set_attribute("streamkit.epoch", epoch)
        self._started[shard] = (time.perf_counter(), span)
        if self._inner is not None:
            self._inner.read_started(shard, member_id, epoch)

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None:
        started = self._started.pop(shard, None)
        if started is not None:
            self.timing.add(time.perf_counter() - started[0])
            span = started[1]
            if span is not None:
                if span.is_recording():
                    span.set_attribute("messaging.batch.message_count", count)
                span.end()
        if self._inner is not None:
            self._inner.read_finished(shard, member_id, epoch, count)


def end_span(span: trace.Span | None, error: BaseException | None) -> None:
    """End a debug span, marked as failed when ``error`` is set."""
    if span is None:
        return
    if error is not None and span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end()
