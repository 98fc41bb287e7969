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
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        SummaryMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "streamkit.observability.metrics needs prometheus-client: pip install 'streamkit[metrics]'"
    ) from exc

from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.member import MemberPhase
from streamkit.consumer.stats import ReadTimer
from streamkit.middleware import (
    BatchContext,
    BatchNext,
    Middleware,
    PublishContext,
    PublishManyContext,
    PublishManyNext,
    PublishNext,
    ReadContext,
    ReadNext,
)
from streamkit.publisher.errors import PublishBatchError, RoutingUnavailable, StaleRouteError
from streamkit.results import ConsumeResult, Outcome, PublishResult

if TYPE_CHECKING:
    from streamkit.app import StreamKit

__all__ = ["AppCollector", "PrometheusMiddleware", "error_reason"]

_LABELS: Final = ("stream_prefix", "group")
_Family = GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily | HistogramMetricFamily
_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# The "le" label of each bucket as Prometheus writes it ("1.0", "+Inf").
_LE: Final = (*(repr(float(b)) for b in _BUCKETS), "+Inf")


def error_reason(error: BaseException) -> str:
    """A bounded label for a publish error (never the message text)."""
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


class _Histogram:
    """A histogram's bucket counts and sum as plain numbers (see ``_Group``)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, i.e. Prometheus' "le" bucket.
        self.counts[bisect_left(_BUCKETS, value)] += 1
        self.total += value

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        cumulative, running = [], 0
        for bound, count in zip(_LE, self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        family.add_metric(labels, cumulative, self.total)


class _Group:
    """The numbers of one (stream prefix, group): plain attributes, no locks.

    prometheus-client's metric objects take a lock and check their state on
    every ``inc``/``observe`` (five of them per entry: see docs/performance.md); the
    middleware runs on the event loop only, so plain additions do, and
    ``collect`` turns them into metric families at scrape time.  In flight is
    what was received (read, for a per-entry handler) and has not ended.
    """

    __slots__ = (
        "duration",
        "ended",
        "failed",
        "publish_duration",
        "publish_errors",
        "published",
        "received",
        "succeeded",
    )

    def __init__(self) -> None:
        self.received = 0
        self.ended = 0
        # Acked entries counted apart: the common case skips the enum (hashing
        # an Enum member runs Python code).
        self.succeeded = 0
        self.failed = dict.fromkeys(Outcome, 0)
        self.duration = _Histogram()
        self.published = 0
        self.publish_duration = _Histogram()
        self.publish_errors: dict[str, int] = {}

    async def handled(
        self, size: int, call_next: Callable[[], Awaitable[list[ConsumeResult]]]
    ) -> list[ConsumeResult]:
        """``call_next()``, its ``size`` entries in flight while it runs."""
        self.received += size
        try:
            return await call_next()
        finally:
            self.ended += size

    def count(self, results: list[ConsumeResult], *, time_each: bool) -> None:
        """Count the outcomes of ``results``; with ``time_each``, also time
        each one (a handler call each; a batch call is timed once, by the caller).

        ``_Histogram.observe`` inlined: this loop runs per entry.
        """
        counts = self.duration.counts
        total = 0.0
        succeeded = 0
        for result in results:
            if time_each:
                seconds = result.duration_s
                counts[bisect_left(_BUCKETS, seconds)] += 1
                total += seconds
            if result.decision is None:
                succeeded += 1
            else:
                self.failed[result.outcome] += 1
        self.duration.total += total
        self.succeeded += succeeded


class PrometheusMiddleware(Middleware, Collector):
    """Counters and histograms of handled entries and publishes.

    Registers itself, a collector, on ``registry`` (default: prometheus-client's
    global one); the figures are plain numbers until a scrape reads them.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._groups: dict[tuple[str, str], _Group] = {}
        from prometheus_client import REGISTRY

        (registry if registry is not None else REGISTRY).register(self)

    def _group(self, stream_prefix: str, group: str) -> _Group:
        key = (stream_prefix, group)
        found = self._groups.get(key)
        if found is None:
            found = self._groups[key] = _Group()
        return found

    async def consume_read(self, ctx: ReadContext, call_next: ReadNext) -> list[ConsumeResult]:
        # Once per read, not per entry: a per-entry level would cost about
        # as much as handling a small entry does (a coroutine, a context).
        group = self._group(ctx.stream_prefix, ctx.consumer_group)
        results = await group.handled(len(ctx.messages), call_next)
        group.count(results, time_each=True)
        return results

    async def consume_batch(self, ctx: BatchContext, call_next: BatchNext) -> list[ConsumeResult]:
        group = self._group(ctx.stream_prefix, ctx.consumer_group)
        results = await group.handled(len(ctx.messages), call_next)
        if results:  # one handler call: timed once
            group.duration.observe(results[0].duration_s)
        group.count(results, time_each=False)
        return results

    async def publish(self, ctx: PublishContext, call_next: PublishNext) -> PublishResult:
        group = self._group(ctx.stream_prefix, ctx.consumer_group)
        started = time.perf_counter()
        try:
            result = await call_next()
        except Exception as exc:
            _count(group.publish_errors, error_reason(exc))
            raise
        group.publish_duration.observe(time.perf_counter() - started)
        group.published += 1
        return result

    async def publish_many(
        self, ctx: PublishManyContext, call_next: PublishManyNext
    ) -> list[PublishResult]:
        group = self._group(ctx.stream_prefix, ctx.consumer_group)
        started = time.perf_counter()
        try:
            results = await call_next()
        except PublishBatchError as exc:
            group.published += sum(r is not None for r in exc.results)
            for error in exc.errors.values():
                _count(group.publish_errors, error_reason(error))
            raise
        except Exception as exc:
            _count(group.publish_errors, error_reason(exc))
            raise
        group.publish_duration.observe(time.perf_counter() - started)
        group.published += len(results)
        return results

    # -- the collector -------------------------------------------------------------------

    def collect(self) -> Iterator[_Family]:
        f = self._families()
        for (prefix, name), group in list(self._groups.items()):
            labels = [prefix, name]
            f.received.add_metric(labels, group.received)
            for outcome, count in group.failed.items():
                if outcome is Outcome.ACKED:
                    count = group.succeeded
                f.handled.add_metric([*labels, outcome.value], count)
            group.duration.add_to(f.duration, labels)
            f.in_flight.add_metric(labels, group.received - group.ended)
            f.published.add_metric(labels, group.published)
            group.publish_duration.add_to(f.publish_duration, labels)
            for reason, count in list(group.publish_errors.items()):
                f.publish_errors.add_metric([*labels, reason], count)
        yield from f

    def describe(self) -> Iterator[_Family]:
        yield from self._families()

    @staticmethod
    def _families() -> _MiddlewareFamilies:
        labels = list(_LABELS)
        return _MiddlewareFamilies(
            received=CounterMetricFamily(
                "streamkit_consumer_entries_received",
                "Entries read for a handler (an entry given back unhandled counts again "
                "when it is read again).",
                labels=labels,
            ),
            handled=CounterMetricFamily(
                "streamkit_consumer_entries_handled",
                "Entries whose handler finished, by outcome "
                "(acked, retried, dead_lettered, halted).",
                labels=[*labels, "outcome"],
            ),
            duration=HistogramMetricFamily(
                "streamkit_consumer_handler_duration_seconds",
                "Handler run time (per entry, or per call of a batch handler).",
                labels=labels,
            ),
            in_flight=GaugeMetricFamily(
                "streamkit_consumer_in_flight",
                "Entries read and not finished yet (their handler runs or waits its turn).",
                labels=labels,
            ),
            published=CounterMetricFamily(
                "streamkit_publish_messages", "Messages published.", labels=labels
            ),
            publish_duration=HistogramMetricFamily(
                "streamkit_publish_duration_seconds",
                "Duration of a publish or publish_many call.",
                labels=labels,
            ),
            publish_errors=CounterMetricFamily(
                "streamkit_publish_errors",
                "Failed publish / publish_many calls, by reason.",
                labels=[*labels, "reason"],
            ),
        )


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


class _FamilySet:
    """Dataclasses of metric families, iterated in field order (a scrape's output)."""

    def __iter__(self) -> Iterator[_Family]:
        return iter(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _MiddlewareFamilies(_FamilySet):
    received: CounterMetricFamily
    handled: CounterMetricFamily
    duration: HistogramMetricFamily
    in_flight: GaugeMetricFamily
    published: CounterMetricFamily
    publish_duration: HistogramMetricFamily
    publish_errors: CounterMetricFamily


_MEMBER_LABELS: Final = ["stream_prefix", "group", "member"]
_GROUP_LABELS: Final = ["stream_prefix", "group"]


@dataclass(frozen=True, slots=True)
class _Families(_FamilySet):
    owned: GaugeMetricFamily
    joined: GaugeMetricFamily
    state: GaugeMetricFamily
    lease: GaugeMetricFamily
    heartbeat: SummaryMetricFamily
    heartbeat_failures: CounterMetricFamily
    poll: SummaryMetricFamily
    refreshes: CounterMetricFamily
    retries: CounterMetricFamily
    duplicates: CounterMetricFamily
    fenced: CounterMetricFamily
    deduplicated: CounterMetricFamily


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
            for state in MemberPhase:
                f.state.add_metric([*values, state.value], 1.0 if state is current else 0.0)
            f.lease.add_metric(values, machine.lease_remaining_ms(now) / 1000)
            beats = member.heartbeats
            f.heartbeat.add_metric(values, beats.count, beats.seconds)
            f.heartbeat_failures.add_metric(values, beats.failures)
            observer = member.poller.observer if member.poller is not None else None
            if isinstance(observer, ReadTimer):
                f.poll.add_metric(values, observer.timing.count, observer.timing.seconds)
            if member.poller is not None:
                counts = member.poller.commit_counts
                f.duplicates.add_metric(values, counts.duplicates_skipped)
                f.fenced.add_metric(values, counts.fenced)
        for publisher in self._app.publishers:
            values = [publisher.stream_prefix, publisher.consumer_group]
            f.refreshes.add_metric(values, publisher.refresher.refreshes)
            f.retries.add_metric(values, publisher.retries)
            f.deduplicated.add_metric(values, publisher.deduplicated)
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
            duplicates=CounterMetricFamily(
                "streamkit_consumer_duplicates_skipped",
                "Idempotent listeners: entries acked without running the handler (or "
                "without their effects) because their idempotency marker existed.",
                labels=member,
            ),
            fenced=CounterMetricFamily(
                "streamkit_consumer_commits_fenced",
                "Idempotent listeners: commits refused whole because a newer reader "
                "took the shard.",
                labels=member,
            ),
            deduplicated=CounterMetricFamily(
                "streamkit_publish_deduplicated",
                "Idempotent publishes answered from the shard's dedup record "
                "(a retry after a lost reply, or an id published again): nothing appended.",
                labels=_GROUP_LABELS,
            ),
        )
