"""Per-shard and per-member gauges on ``/metrics``, with a cap on series per family.

A group of 10,000 shards would otherwise put 10,000 series per family on
every scrape of every coordinator process.  Each family keeps at most
``cap`` series, and the ones it keeps are those an operator looks for first:
the largest lag and pending counts, the oldest heartbeats, the shortest
leases, the most revoking shards, the shards not simply owned.  What was left
out is counted in ``redis_stream_coord_metric_series_dropped`` (by family), so
a capped dashboard says so.

The rows are computed at scrape time from the last group metadata the tick
loop loaded (every tick) and the last shard figures the lag sampler read
(``autoscaling.py``), with ``now`` given: ``rows`` is pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streamkit_server.core.autoscaling import GroupSample
from streamkit_server.core.model import GroupMetadata

__all__ = ["DEFAULT_SERIES_CAP", "FAMILIES", "DetailGauges", "Row", "capped", "rows"]

DEFAULT_SERIES_CAP = 2_000

_GROUP = ("stream_prefix", "consumer_group")
#: The families of one series per group: name -> help (in ``group_families``' order).
GROUP_FAMILIES: dict[str, str] = {
    "redis_stream_coord_group_lag": (
        "Entries of the group's shard streams not yet delivered (sum of the shards' lag)."
    ),
    "redis_stream_coord_group_pending": (
        "Entries delivered to the group's members and not yet acknowledged."
    ),
    "redis_stream_coord_group_handled_per_second": (
        "Entries the group acknowledged per second over the lag sampler's window."
    ),
    "redis_stream_coord_group_shards": (
        "Shards of the group's layout (an autoscaler's ceiling: shards / concurrency)."
    ),
}
#: name -> (help, extra labels); every family also has the two group labels.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "redis_stream_coord_shard_owner_state": (
        "1 for the shard's ownership state: owned (held by its target owner), revoking "
        "(held by another member), pending (its target owner waits for the revoke), "
        "unassigned (no live target owner).",
        ("shard", "state"),
    ),
    "redis_stream_coord_shard_lag": (
        "Entries of the shard stream not yet delivered to the group (XINFO GROUPS lag).",
        ("shard",),
    ),
    "redis_stream_coord_shard_pending": (
        "Entries of the shard delivered to the group and not yet acknowledged.",
        ("shard",),
    ),
    "redis_stream_coord_member_last_heartbeat_age_seconds": (
        "Seconds since the live member's last heartbeat.",
        ("member_id",),
    ),
    "redis_stream_coord_member_lease_remaining_seconds": (
        "Seconds until the live member's lease runs out without a heartbeat (negative: overdue).",
        ("member_id",),
    ),
    "redis_stream_coord_member_revoking_shards": (
        "Shards the live member holds but was asked to give up.",
        ("member_id",),
    ),
}
# Severity order of the owner states: the cap keeps the worst first.
_STATE_RANK = {"revoking": 3, "pending": 2, "unassigned": 1, "owned": 0}


class Row(NamedTuple):
    # A tuple, not a frozen dataclass: a scrape of 10,000 shards builds tens of
    # thousands of these, and a frozen dataclass's __init__ is several times slower.
    labels: tuple[str, ...]
    value: float
    # What the cap keeps first (highest); ties keep the lowest labels.
    severity: float


def capped(items: Iterable[Row], cap: int) -> tuple[list[Row], int]:
    """At most ``cap`` rows, the most severe; and how many were left out."""
    all_rows = list(items)
    if len(all_rows) <= cap:
        return sorted(all_rows, key=lambda r: r.labels), 0
    # Most severe first, ties by labels: the same series survive from scrape to scrape.
    ranked = sorted(all_rows, key=lambda r: (-r.severity, r.labels))
    return sorted(ranked[:cap], key=lambda r: r.labels), len(all_rows) - cap


def _shard_state(group: GroupMetadata, shard: int, live: set[str]) -> str:
    owner, wanted = group.owners.get(shard), group.target.get(shard)
    if owner is not None and owner in live and owner != wanted:
        return "revoking"
    if wanted is None or wanted not in live:
        return "unassigned"
    return "owned" if owner == wanted else "pending"


def rows(
    group: GroupMetadata,
    sample: GroupSample | None,
    now_ms: int,
    lease_ttl_ms: int,
) -> dict[str, list[Row]]:
    """Every family's rows for one group (uncapped)."""
    g = (group.stream_prefix, group.consumer_group)
    out: dict[str, list[Row]] = {name: [] for name in FAMILIES}
    live = {m for m, meta in group.members.items() if meta.live}
    shards = sorted(set(group.layout) | set(group.draining_shards) | set(group.target))
    for shard in shards:
        state = _shard_state(group, shard, live)
        out["redis_stream_coord_shard_owner_state"].append(
            Row((*g, str(shard), state), 1.0, _STATE_RANK[state])
        )
    if sample is not None:
        for s in sample.shards:
            if s.lag is not None:
                out["redis_stream_coord_shard_lag"].append(Row((*g, str(s.shard)), s.lag, s.lag))
            out["redis_stream_coord_shard_pending"].append(
                Row((*g, str(s.shard)), s.pending, s.pending)
            )
    revoking: dict[str, int] = {}
    for shard, owner in group.owners.items():
        if owner in live and group.target.get(shard) != owner:
            revoking[owner] = revoking.get(owner, 0) + 1
    for member_id in sorted(live):
        age_ms = max(0, now_ms - group.members[member_id].last_heartbeat_ms)
        labels = (*g, member_id)
        out["redis_stream_coord_member_last_heartbeat_age_seconds"].append(
            Row(labels, age_ms / 1000, age_ms)
        )
        left_ms = lease_ttl_ms - age_ms
        out["redis_stream_coord_member_lease_remaining_seconds"].append(
            Row(labels, left_ms / 1000, -left_ms)
        )
        count = revoking.get(member_id, 0)
        out["redis_stream_coord_member_revoking_shards"].append(Row(labels, count, count))
    return out


@dataclass(eq=False)  # registries key collectors by identity
class DetailGauges(Collector):
    """The capped families, collected from the latest metadata and shard samples."""

    cap: int = DEFAULT_SERIES_CAP
    lease_ttl_ms: int = 15_000
    groups: dict[tuple[str, str], GroupMetadata] = field(default_factory=dict)
    samples: dict[tuple[str, str], GroupSample] = field(default_factory=dict)
    # Entries acknowledged per second, per group (from the lag sampler's window).
    rates: dict[tuple[str, str], float] = field(default_factory=dict)
    # The wall clock, injectable so a test can fix it.
    clock_ms: Callable[[], int] | None = None

    def observe_group(self, group: GroupMetadata) -> None:
        self.groups[group.stream_prefix, group.consumer_group] = group

    def observe_sample(
        self, prefix: str, group: str, sample: GroupSample, handled_per_second: float | None
    ) -> None:
        self.samples[prefix, group] = sample
        if handled_per_second is not None:
            self.rates[prefix, group] = handled_per_second

    def forget_except(self, seen: Iterable[tuple[str, str]]) -> None:
        """Deleted groups drop their series."""
        keep = set(seen)
        for store in (self.groups, self.samples, self.rates):
            for key in [k for k in store if k not in keep]:
                del store[key]

    def _now_ms(self) -> int:
        return self.clock_ms() if self.clock_ms is not None else int(time.time() * 1000)

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # collected lazily; no series until a group is observed

    def collect(self) -> Iterator[GaugeMetricFamily]:
        out = families(self.groups, self.samples, self._now_ms(), self.lease_ttl_ms, self.cap)
        out.extend(group_families(self.groups, self.samples, self.rates))
        return iter(out)


def group_families(
    groups: Mapping[tuple[str, str], GroupMetadata],
    samples: Mapping[tuple[str, str], GroupSample],
    rates: Mapping[tuple[str, str], float],
) -> list[GaugeMetricFamily]:
    """One series per group (bounded by the group count, so not capped): the
    figures an HPA on Prometheus scales with (docs/operations.md#autoscaling)."""
    lag, pending, handled, shards = (
        GaugeMetricFamily(name, help_text, labels=list(_GROUP))
        for name, help_text in GROUP_FAMILIES.items()
    )
    for key, group in sorted(groups.items()):
        shards.add_metric(list(key), group.shard_count)
        sample = samples.get(key)
        if sample is not None:
            lag.add_metric(list(key), sum(s.lag or 0 for s in sample.shards))
            pending.add_metric(list(key), sum(s.pending for s in sample.shards))
        if key in rates:
            handled.add_metric(list(key), rates[key])
    return [lag, pending, handled, shards]


def families(
    groups: Mapping[tuple[str, str], GroupMetadata],
    samples: Mapping[tuple[str, str], GroupSample],
    now_ms: int,
    lease_ttl_ms: int,
    cap: int,
) -> list[GaugeMetricFamily]:
    """The per-shard and per-member families, each capped at ``cap`` series."""
    merged: dict[str, list[Row]] = {name: [] for name in FAMILIES}
    for key, group in groups.items():
        for name, found in rows(group, samples.get(key), now_ms, lease_ttl_ms).items():
            merged[name].extend(found)
    dropped = GaugeMetricFamily(
        "redis_stream_coord_metric_series_dropped",
        "Series left out of a per-shard or per-member family by the cardinality cap "
        "(STREAMKIT_SERVER_METRICS_SERIES_CAP).",
        labels=["family"],
    )
    out = []
    for name, (help_text, extra) in FAMILIES.items():
        family = GaugeMetricFamily(name, help_text, labels=[*_GROUP, *extra])
        kept, left_out = capped(merged[name], cap)
        for row in kept:
            family.add_metric(list(row.labels), row.value)
        dropped.add_metric([name], left_out)
        out.append(family)
    out.append(dropped)
    return out
