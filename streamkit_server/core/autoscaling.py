"""The autoscaling signal of one consumer group (pure: samples and ``now`` are given).

An autoscaler (KEDA's ``metrics-api`` scaler, an HPA on an external metric)
needs one number: how many consumer processes the group should have.  Each
process runs ``concurrency`` members and each member reads at least one
shard, so more than ``ceil(shards / concurrency)`` processes only adds idle
members: the recommendation never exceeds that.

The backlog of a shard is its group ``lag`` (entries not yet delivered) plus
its ``pending`` count (delivered, not acknowledged: a stalled handler's
entries are pending, not lagging).  Throughput is what the group finished
between two samples: per shard ``entries-read - pending`` only grows as
entries are acknowledged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_TARGET_LAG",
    "GroupSample",
    "Recommendation",
    "ShardSample",
    "handled_total",
    "recommend",
]

#: Bounds of the two request parameters (validated before any Redis call).
MAX_CONCURRENCY = 4096
MAX_TARGET_LAG = 10**12


@dataclass(frozen=True, slots=True)
class ShardSample:
    """One shard stream's group figures from ``XINFO GROUPS``."""

    shard: int
    # None: Redis cannot tell (entries were deleted inside the unread range).
    lag: int | None
    pending: int
    # None: the group has not read the stream yet (Redis reports nil).
    entries_read: int | None


@dataclass(frozen=True, slots=True)
class GroupSample:
    at_ms: int
    shards: tuple[ShardSample, ...]


@dataclass(frozen=True, slots=True)
class Recommendation:
    shard_count: int
    concurrency: int
    target_lag: int
    total_lag: int
    total_pending: int
    # Shards whose lag Redis could not compute (left out of ``total_lag``).
    lag_unknown_shards: tuple[int, ...]
    # Entries acknowledged per second over the window; None with one sample.
    handled_per_second: float | None
    window_seconds: float
    max_useful_replicas: int
    recommended_replicas: int


def handled_total(sample: GroupSample) -> int:
    """Entries the group has finished on these shards so far (read, not pending)."""
    return sum(max(0, (s.entries_read or 0) - s.pending) for s in sample.shards)


def _throughput(samples: Sequence[GroupSample]) -> tuple[float | None, float]:
    if len(samples) < 2:
        return None, 0.0
    first, last = samples[0], samples[-1]
    seconds = (last.at_ms - first.at_ms) / 1000
    if seconds <= 0:
        return None, 0.0
    # Only shards present in both: a shard added or retired in between would
    # count its whole history as handled in the window.
    before = {s.shard: s for s in first.shards}
    done = 0
    for shard in last.shards:
        old = before.get(shard.shard)
        if old is not None:
            now_done = (shard.entries_read or 0) - shard.pending
            old_done = (old.entries_read or 0) - old.pending
            done += max(0, now_done - old_done)
    return done / seconds, seconds


def recommend(
    samples: Sequence[GroupSample], shard_count: int, concurrency: int, target_lag: int
) -> Recommendation:
    """The recommendation from ``samples`` (oldest first; the last is "now").

    ``ceil(backlog / target_lag)`` processes, so each is left about
    ``target_lag`` entries; at least one while anything is backlogged or was
    handled in the window (scale to zero only when the group is idle); at most
    ``ceil(shard_count / concurrency)``.
    """
    if not samples:
        raise ValueError("recommend needs at least one sample")
    if concurrency < 1 or target_lag < 1:
        raise ValueError("concurrency and target_lag must be at least 1")
    now = samples[-1]
    lag = sum(s.lag for s in now.shards if s.lag is not None)
    pending = sum(s.pending for s in now.shards)
    unknown = tuple(sorted(s.shard for s in now.shards if s.lag is None))
    rate, seconds = _throughput(samples)
    ceiling = math.ceil(shard_count / concurrency)
    wanted = math.ceil((lag + pending) / target_lag)
    if wanted == 0 and (unknown or (rate or 0) > 0):
        wanted = 1  # busy (or unknown) but keeping up: never scale a working group to zero
    return Recommendation(
        shard_count=shard_count,
        concurrency=concurrency,
        target_lag=target_lag,
        total_lag=lag,
        total_pending=pending,
        lag_unknown_shards=unknown,
        handled_per_second=rate,
        window_seconds=seconds,
        max_useful_replicas=ceiling,
        recommended_replicas=min(wanted, ceiling),
    )
