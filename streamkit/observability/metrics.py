"""Prometheus metrics of a streamkit process (needs ``streamkit[metrics]``).

:class:`PrometheusMiddleware` counts and times every handled entry and every
publish.  :class:`AppCollector` reads the members' state at scrape time
(owned shards, state, lease remaining, heartbeat and read round trips, which
the members count themselves), so nothing runs between scrapes.

Labels are bounded: ``stream_prefix`` and ``group`` (fixed by the code),
``outcome``, ``reason`` and ``state`` (fixed sets), and ``member`` only on the
per-member metrics (a process runs ``concurrency`` members per listener).
No metric is labelled by shard index, entry id or partition key.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "streamkit.observability.metrics needs prometheus-client: pip install 'streamkit[metrics]'"
    ) from exc

from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.member import MemberState
from streamkit.consumer.stats import ReadTimer
from streamkit.middleware import (
    BatchContext,
    BatchNext,
    ConsumeContext,
    ConsumeNext,
    ConsumeResult,
    Middleware,
    Outcome,
    PublishContext,
    PublishManyContext,
    PublishManyNext,
    PublishNext,
)

if TYPE_CHECKING:
    from streamkit.app import StreamKit
    from streamkit.publisher.publisher import PublishResult

__all__ = ["AppCollector", "PrometheusMiddleware", "error_reason"]

_LABELS: Final = ("stream_prefix", "group")
_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def error_reason(error: BaseException) -> str:
    """A bounded label for a publish error (never the message text)."""
    from streamkit.publisher.publisher import StaleRouteError
    from streamkit.publisher.routing_cache import RoutingUnavailable

    if isinstance(error, StaleRouteError):
        return "stale_route"
    if isinstance(error, RoutingUnavailable):
        return "routing_unavailable"
    if isinstance(error, TypeError | ValueError):
        return "invalid_fields"
    if isinstance(error, ConnectionError | TimeoutError | OSError):
        return "connection"
    module = type(error).__module__
    return "redis" if module.startswith("redis") else "other"


@dataclass(frozen=True, slots=True)
class _Children:
    received: Counter
    handled: dict[Outcome, Counter]
    duration: Histogram
    in_flight: Gauge


class PrometheusMiddleware(Middleware):
    """Counters and histograms of handled entries and publishes.

    Registers on ``registry`` (default: prometheus-client's global one).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._cache: dict[tuple[str, str], _Children] = {}
        from prometheus_client import REGISTRY

        kw = registry if registry is not None else REGISTRY
        self.received = Counter(
            "streamkit_consumer_entries_received",
            "Entries handed to a handler.",
            _LABELS,
            registry=kw,
        )
        self.handled = Counter(
            "streamkit_consumer_entries_handled",
            "Entries whose handler finished, by outcome (acked, retried, dead_lettered, halted).",
            (*_LABELS, "outcome"),
            registry=kw,
        )
        self.duration = Histogram(
            "streamkit_consumer_handler_duration_seconds",
            "Handler run time (per entry, or per call of a batch handler).",
            _LABELS,
            buckets=_BUCKETS,
            registry=kw,
        )
        self.in_flight = Gauge(
            "streamkit_consumer_in_flight",
            "Entries (or batches) whose handler is running.",
            _LABELS,
            registry=kw,
        )
        self.published = Counter(
            "streamkit_publish_messages",
            "Messages published.",
            _LABELS,
            registry=kw,
        )
        self.publish_duration = Histogram(
            "streamkit_publish_duration_seconds",
            "Duration of a publish or publish_many call.",
            _LABELS,
            buckets=_BUCKETS,
            registry=kw,
        )
        self.publish_errors = Counter(
            "streamkit_publish_errors",
            "Failed publish / publish_many calls, by reason.",
            (*_LABELS, "reason"),
            registry=kw,
        )

    def _children(self, stream_prefix: str, group: str) -> _Children:
        # labels() takes a lock and builds a key on every call: look each
        # label set up once (their number is bounded by the app's listeners).
        key = (stream_prefix, group)
        children = self._cache.get(key)
        if children is None:
            children = self._cache[key] = _Children(
                self.received.labels(*key),
                {o: self.handled.labels(*key, o.value) for o in Outcome},
                self.duration.labels(*key),
                self.in_flight.labels(*key),
            )
        return children

    async def consume(self, ctx: ConsumeContext, call_next: ConsumeNext) -> ConsumeResult:
        children = self._children(ctx.stream_prefix, ctx.consumer_group)
        children.received.inc()
        children.in_flight.inc()
        try:
            result = await call_next()
        finally:
            children.in_flight.dec()
        children.duration.observe(result.duration_s)
        children.handled[result.outcome].inc()
        return result

    async def consume_batch(self, ctx: BatchContext, call_next: BatchNext) -> list[ConsumeResult]:
        labels = (ctx.stream_prefix, ctx.consumer_group)
        self.received.labels(*labels).inc(len(ctx.messages))
        gauge = self.in_flight.labels(*labels)
        gauge.inc(len(ctx.messages))
        try:
            results = await call_next()
        finally:
            gauge.dec(len(ctx.messages))
        if results:
            self.duration.labels(*labels).observe(results[0].duration_s)
        for result in results:
            self.handled.labels(*labels, result.outcome.value).inc()
        return results

    async def publish(self, ctx: PublishContext, call_next: PublishNext) -> PublishResult:
        labels = (ctx.stream_prefix, ctx.consumer_group)
        started = time.perf_counter()
        try:
            result = await call_next()
        except Exception as exc:
            self.publish_errors.labels(*labels, error_reason(exc)).inc()
            raise
        self.publish_duration.labels(*labels).observe(time.perf_counter() - started)
        self.published.labels(*labels).inc()
        return result

    async def publish_many(
        self, ctx: PublishManyContext, call_next: PublishManyNext
    ) -> list[PublishResult]:
        from streamkit.publisher.publisher import PublishBatchError

        labels = (ctx.stream_prefix, ctx.consumer_group)
        started = time.perf_counter()
        try:
            results = await call_next()
        except PublishBatchError as exc:
            self.published.labels(*labels).inc(sum(r is not None for r in exc.results))
            for error in exc.errors.values():
                self.publish_errors.labels(*labels, error_reason(error)).inc()
            raise
        except Exception as exc:
            self.publish_errors.labels(*labels, error_reason(exc)).inc()
            raise
        self.publish_duration.labels(*labels).observe(time.perf_counter() - started)
        self.published.labels(*labels).inc(len(results))
        return results


_MEMBER_LABELS: Final = ["stream_prefix", "group", "member"]
_GROUP_LABELS: Final = ["stream_prefix", "group"]

_Family = GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily


@dataclass(frozen=True, slots=True)
class _Families:
    owned: GaugeMetricFamily
    joined: GaugeMetricFamily
    state: GaugeMetricFamily
    lease: GaugeMetricFamily
    heartbeat: SummaryMetricFamily
    heartbeat_failures: CounterMetricFamily
    poll: SummaryMetricFamily
    refreshes: CounterMetricFamily
    retries: CounterMetricFamily

    def __iter__(self) -> Iterator[_Family]:
        return iter(getattr(self, f.name) for f in fields(self))


class AppCollector(Collector):
    """Gauges, counters and summaries of a :class:`~streamkit.app.StreamKit`
    read at scrape time: its members' state and round trips, and its
    publishers' own counters."""

    def __init__(self, app: StreamKit) -> None:
        self._app = app

    def collect(self) -> Iterator[_Family]:
        f = self._families()
        now = monotonic_ms()
        for member in self._app.members:
            machine = member.machine
            values = [member.stream_prefix, member.consumer_group, member.member_id]
            f.owned.add_metric(values, len(machine.readable(now)))
            f.joined.add_metric(values, 1.0 if machine.joined else 0.0)
            current = machine.state
            for state in MemberState:
                f.state.add_metric([*values, state.value], 1.0 if state is current else 0.0)
            f.lease.add_metric(values, machine.lease_remaining_ms(now) / 1000)
            beats = member.heartbeats
            f.heartbeat.add_metric(values, beats.count, beats.seconds)
            f.heartbeat_failures.add_metric(values, beats.failures)
            observer = member.poller.observer if member.poller is not None else None
            if isinstance(observer, ReadTimer):
                f.poll.add_metric(values, observer.timing.count, observer.timing.seconds)
        for publisher in self._app.publishers:
            values = [publisher.stream_prefix, publisher.consumer_group]
            f.refreshes.add_metric(values, publisher.refresher.refreshes)
            f.retries.add_metric(values, publisher.retries)
        yield from f

    def describe(self) -> Iterator[_Family]:
        # Names only: registering does no scrape-time work.
        yield from self._families()

    @staticmethod
    def _families() -> _Families:
        member = _MEMBER_LABELS
        return _Families(
            owned=GaugeMetricFamily(
                "streamkit_member_owned_shards", "Shards the member may read now.", labels=member
            ),
            joined=GaugeMetricFamily(
                "streamkit_member_joined", "1 when the member has joined its group.", labels=member
            ),
            state=GaugeMetricFamily(
                "streamkit_member_state",
                "1 for the member's current state (joining, stable, reconciling, stopping, left).",
                labels=[*member, "state"],
            ),
            lease=GaugeMetricFamily(
                "streamkit_member_lease_remaining_seconds",
                "Time reads stay allowed without another heartbeat answer.",
                labels=member,
            ),
            heartbeat=SummaryMetricFamily(
                "streamkit_member_heartbeat_duration_seconds",
                "Round-trip time of answered heartbeats.",
                labels=member,
            ),
            heartbeat_failures=CounterMetricFamily(
                "streamkit_member_heartbeat_failures",
                "Heartbeats that failed (coordinator down, timeout, error answer).",
                labels=member,
            ),
            poll=SummaryMetricFamily(
                "streamkit_consumer_poll_duration_seconds",
                "Duration of the member's Redis reads (a blocking read of an idle shard "
                "includes its wait).",
                labels=member,
            ),
            refreshes=CounterMetricFamily(
                "streamkit_publish_routing_refreshes",
                "Routing refreshes the publisher started.",
                labels=_GROUP_LABELS,
            ),
            retries=CounterMetricFamily(
                "streamkit_publish_retries",
                "Messages the publisher sent again (connection errors, stale routes).",
                labels=_GROUP_LABELS,
            ),
        )
