"""Prometheus metrics (``redis_stream_coord_*``), one registry per app.

A registry per app instead of the global default lets tests build several apps
in one process without "duplicated timeseries" errors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamkit_server.observability.detail_gauges import DetailGauges

__all__ = [
    "AUDIT_STREAM_FAILURES",
    "COMPATIBILITY_KINDS",
    "Metrics",
    "RouteFigures",
    "bucket_quantile",
]

COMPATIBILITY_KINDS = ("redis_command", "coordination_version")
AUDIT_STREAM_FAILURES = ("redis_error", "queue_full")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Labelled:
    """A metric's labelled children, each looked up once per label values.

    ``labels()`` takes a lock and builds its key on every call; on a path that
    runs per request that costs more than the count itself.  Only for labels
    whose values are bounded (a status, a route template).
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.heartbeats = Counter(
            "redis_stream_coord_heartbeats_total",
            "Heartbeats answered, by response status.",
            ["status"],
            registry=r,
        )
        self.heartbeat_seconds = Histogram(
            "redis_stream_coord_heartbeat_duration_seconds",
            "Time to answer a heartbeat, mutex wait included.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.mutex_wait_seconds = Histogram(
            "redis_stream_coord_mutex_wait_seconds",
            "Time spent acquiring a group mutex in Redis.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.mutex_timeouts = Counter(
            "redis_stream_coord_mutex_timeout_total",
            "Critical sections abandoned because the group mutex stayed taken.",
            registry=r,
        )
        self.batch_size = Histogram(
            "redis_stream_coord_batch_size",
            "Operations applied per critical section (heartbeats are batched per group).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.store_writes = Counter(
            "redis_stream_coord_store_writes_total",
            "Successful metadata writes (each bumps the group's storeRevision by one).",
            registry=r,
        )
        self.locked_writes = Counter(
            "redis_stream_coord_locked_writes_total",
            "Critical sections that took the locked path (mutex, load, compare-and-set)"
            " instead of the one-round-trip steady write, by reason.",
            ["reason"],
            registry=r,
        )
        self.steady_catch_ups = Counter(
            "redis_stream_coord_steady_catch_ups_total",
            "One-round-trip steady writes made on a copy that other member-only writes"
            " (another process's heartbeats) had passed; their records came back with it.",
            registry=r,
        )
        self.token_version_reads = Counter(
            "redis_stream_coord_token_version_reads_total",
            "Token versions looked up for bearer requests, by source: 'cache' (kept"
            " current by Redis's invalidation pushes) or 'redis' (an HGET).",
            ["source"],
            registry=r,
        )
        self.steady_pipeline_sizes = Histogram(
            "redis_stream_coord_steady_pipeline_size",
            "Steady writes sent together in one pipeline: those that arrived while"
            " another was in flight (a write that finds none in flight goes alone and"
            " is not counted here).",
            buckets=(2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.state_conflicts = Counter(
            "redis_stream_coord_state_conflict_total",
            "Metadata writes rejected by the storeRevision CAS (workflow retried).",
            registry=r,
        )
        self.metadata_missing = Counter(
            "redis_stream_coord_metadata_missing_total",
            "Requests for a group whose metadata key does not exist (failed closed).",
            registry=r,
        )
        self.metadata_regression = Counter(
            "redis_stream_coord_metadata_regression_total",
            "Locked loads that found Redis went back: a lower storeRevision than this "
            "process saw, or a document write on another Redis server incarnation.",
            registry=r,
        )
        self.metadata_version_ahead = Counter(
            "redis_stream_coord_client_version_ahead_total",
            "Heartbeats reporting a metadataVersion above the one stored in Redis.",
            registry=r,
        )
        self.rollback_witnesses = Counter(
            "redis_stream_coord_rollback_witnesses_total",
            "Heartbeats claiming state Redis lacks, by verdict: accepted (opened or "
            "restarted a correction round) or why the claim was ignored "
            "(unknown-member, not-live, other-incarnation, implausible).",
            ["verdict"],
            registry=r,
        )
        self.schema_errors = Counter(
            "redis_stream_coord_metadata_schema_error_total",
            "Loads refused because of an unknown schema/layout version or a corrupt hash.",
            registry=r,
        )
        self.invariant_violations = Counter(
            "redis_stream_coord_invariant_violation_total",
            "Invariant violations found in metadata after a write.",
            registry=r,
        )
        self.member_expired = Counter(
            "redis_stream_coord_member_expired_total",
            "Members expired because their lease ran out.",
            registry=r,
        )
        self.member_fenced = Counter(
            "redis_stream_coord_member_fenced_total",
            "Members fenced (stale ownership or rebalance timeout).",
            registry=r,
        )
        self.ticks = Counter(
            "redis_stream_coord_tick_transitions_total",
            "Groups changed by the tick loop (expiries, fencing, clean-up).",
            registry=r,
        )
        self.tick_lag_seconds = Gauge(
            "redis_stream_coord_tick_lag_seconds",
            "How late the last tick pass started compared to its schedule.",
            registry=r,
        )
        self.terminating = Gauge(
            "redis_stream_coord_terminating",
            "1 once the process entered terminating mode.",
            registry=r,
        )
        self.suspended = Gauge(
            "redis_stream_coord_suspended",
            "1 while the process decides nothing because another live coordinator on"
            " its Redis runs with other timing settings.",
            registry=r,
        )
        self.resharding_age_seconds = Gauge(
            "redis_stream_coord_resharding_active_age_seconds",
            "Age of the stream's active migration (alert when it exceeds the drain window).",
            ["stream_prefix"],
            registry=r,
        )
        self.shards_retired = Counter(
            "redis_stream_coord_shard_retired_total",
            "Removed shard streams deleted after the Redis-level drain proof.",
            registry=r,
        )
        self.retirements_refused = Counter(
            "redis_stream_coord_shard_retirement_refused_total",
            "Retirements refused because the re-check found entries (read again first).",
            registry=r,
        )
        self.provisioning_failures = Counter(
            "redis_stream_coord_provisioning_failure_total",
            "Scale requests whose new shard streams could not be provisioned.",
            registry=r,
        )
        group = ["stream_prefix", "consumer_group"]
        self.member_heartbeat_age = Gauge(
            "redis_stream_coord_member_heartbeat_age_seconds",
            "Oldest last heartbeat among the group's live members (alert near the lease TTL).",
            group,
            registry=r,
        )
        self.revoke_pending = Gauge(
            "redis_stream_coord_revoke_pending",
            "Live members of the group holding a shard they must give up.",
            group,
            registry=r,
        )
        self.revoking_shards = Gauge(
            "redis_stream_coord_revoking_shards",
            "Shards of the group held by a member other than their target owner.",
            group,
            registry=r,
        )
        self.consumer_shard_pending = Gauge(
            "redis_stream_coord_consumer_shard_pending",
            "Target shards of the group whose new owner waits for a revoke to finish.",
            group,
            registry=r,
        )
        # Retention (coordination/retention.py): one series per stream and
        # group, like the gauges above, with the shards folded in (max).
        self.retention_blocked_seconds = Gauge(
            "redis_stream_coord_retention_blocked_seconds",
            "Age of the oldest entry the group still needs on a shard whose retention waits "
            "for it, the most over the stream's shards (0: it holds nothing back).",
            group,
            registry=r,
        )
        self.retention_blocked_shards = Gauge(
            "redis_stream_coord_retention_blocked_shards",
            "Shards of the stream whose retention waits for the group.",
            group,
            registry=r,
        )
        self.retention_trimmed = Counter(
            "redis_stream_coord_retention_trimmed_total",
            "Entries the retention janitor trimmed from the stream's shards.",
            ["stream_prefix"],
            registry=r,
        )
        # Bounded labels: both are fixed sets, created up front so the series
        # exist (at 0) before the first failure and rate() works at once.
        self.compatibility_failures = _counter_of(
            "redis_stream_coord_command_compatibility_failure_total",
            "Requests refused for compatibility: kind=redis_command (Redis refused a command "
            "the coordinator needs: unknown, renamed or denied by an ACL), "
            "kind=coordination_version (a client's protocol version is not supported).",
            "kind",
            COMPATIBILITY_KINDS,
            r,
        )
        self.audit_stream_failures = _counter_of(
            "redis_stream_coord_audit_stream_failure_total",
            "Audit records not copied to the Redis audit stream (the log line was written).",
            "reason",
            AUDIT_STREAM_FAILURES,
            r,
        )
        self.redis_errors = Counter(
            "redis_stream_coord_redis_errors_total",
            "Requests failed because Redis was unreachable or timed out.",
            registry=r,
        )
        # Labels are bounded: the route is an operationId or a path template,
        # never the raw path a client sent (see api/performance.py).
        self.http_requests = Counter(
            "redis_stream_coord_http_requests_total",
            "HTTP requests answered, by route, method and status class (2xx, 4xx, 5xx).",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "redis_stream_coord_http_request_duration_seconds",
            "Time to answer an HTTP request, by route and method.",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Per-shard and per-member series, capped (detail_gauges.py).
        self.detail = DetailGauges()
        r.register(self.detail)
        # Per request and per heartbeat: the labelled children, looked up once.
        self.heartbeats_by_status = Labelled(self.heartbeats)
        self._requests_by = Labelled(self.http_requests)
        self._seconds_by = Labelled(self.http_seconds)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self._requests_by(route, method, f"{status // 100}xx").inc()
        self._seconds_by(route, method).observe(seconds)

    def route_figures(self) -> list[RouteFigures]:
        """Per-route figures since the process started, busiest route first."""
        statuses: dict[tuple[str, str], dict[str, float]] = {}
        for family in self.http_requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (sample.labels["route"], sample.labels["method"])
                    statuses.setdefault(key, {})[sample.labels["status"]] = sample.value
        buckets: dict[tuple[str, str], list[tuple[float, float]]] = {}
        sums: dict[tuple[str, str], float] = {}
        for family in self.http_seconds.collect():
            for sample in family.samples:
                key = (sample.labels["route"], sample.labels["method"])
                if sample.name.endswith("_bucket"):
                    buckets.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_sum"):
                    sums[key] = sample.value
        out = []
        for key, by_status in statuses.items():
            count = int(sum(by_status.values()))
            bounds = sorted(buckets.get(key, []))
            out.append(
                RouteFigures(
                    route=key[0],
                    method=key[1],
                    count=count,
                    client_errors=int(by_status.get("4xx", 0)),
                    server_errors=int(by_status.get("5xx", 0)),
                    mean_ms=sums.get(key, 0.0) * 1000 / count if count else None,
                    p50_ms=_ms(bucket_quantile(0.5, bounds)),
                    p99_ms=_ms(bucket_quantile(0.99, bounds)),
                )
            )
        return sorted(out, key=lambda f: (-f.count, f.route, f.method))


@dataclass(frozen=True, slots=True)
class RouteFigures:
    route: str
    method: str
    count: int
    client_errors: int
    server_errors: int
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile estimated from cumulative histogram buckets, like PromQL's
    ``histogram_quantile``: linear within the bucket that holds the rank.

    ``buckets`` are ``(upper bound, cumulative count)`` sorted by bound, the
    last one ``+Inf``.  A rank in the ``+Inf`` bucket answers the highest
    finite bound (the histogram cannot say more).  None without observations.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _counter_of(
    name: str, documentation: str, label: str, values: Iterable[str], registry: CollectorRegistry
) -> Counter:
    """A counter over a fixed set of label values, each created at 0 up front."""
    counter = Counter(name, documentation, [label], registry=registry)
    for value in values:
        counter.labels(value)
    return counter
