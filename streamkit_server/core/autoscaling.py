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
    "Backlog",
    "GroupSample",
    "Recommendation",
    "ShardSample",
    "Throughput",
    "backlog",
    "handled_total",
    "recommend",
    "throughput",
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

    @property
    def handled(self) -> int:
        """Entries the group has finished here: read and no longer pending."""
        return (self.entries_read or 0) - self.pending


@dataclass(frozen=True, slots=True)
class GroupSample:
    at_ms: int
    shards: tuple[ShardSample, ...]


@dataclass(frozen=True, slots=True)
class Backlog:
    """What one sample leaves the group to do."""

    lag: int  # entries not delivered yet, on the shards whose lag is known
    pending: int  # delivered, not acknowledged
    # Shards whose lag Redis could not compute (left out of ``lag``).
    lag_unknown_shards: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.lag + self.pending


@dataclass(frozen=True, slots=True)
class Throughput:
    """Entries acknowledged per second over a window; None with one sample."""

    per_second: float | None
    window_seconds: float


@dataclass(frozen=True, slots=True)
class Recommendation:
    backlog: Backlog
    throughput: Throughput
    max_useful_replicas: int
    recommended_replicas: int


def handled_total(sample: GroupSample) -> int:
    """Entries the group has finished on these shards so far (read, not pending)."""
    return sum(max(0, s.handled) for s in sample.shards)


def backlog(sample: GroupSample) -> Backlog:
    known = [s.lag for s in sample.shards if s.lag is not None]
    unknown = tuple(sorted(s.shard for s in sample.shards if s.lag is None))
    return Backlog(sum(known), sum(s.pending for s in sample.shards), unknown)


def throughput(samples: Sequence[GroupSample]) -> Throughput:
    """What the group finished between the first and the last of ``samples``."""
    if len(samples) < 2:
        return Throughput(None, 0.0)
    first, last = samples[0], samples[-1]
    seconds = (last.at_ms - first.at_ms) / 1000
    if seconds <= 0:
        return Throughput(None, 0.0)
    # Only shards present in both: a shard added or retired in between would
    # count its whole history as handled in the window.
    before = {s.shard: s for s in first.shards}
    done = 0
    for shard in last.shards:
        old = before.get(shard.shard)
        if old is not None:
            done += max(0, shard.handled - old.handled)
    return Throughput(done / seconds, seconds)


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
    left = backlog(samples[-1])
    rate = throughput(samples)
    ceiling = math.ceil(shard_count / concurrency)
    wanted = math.ceil(left.total / target_lag)
    if wanted == 0 and (left.lag_unknown_shards or (rate.per_second or 0) > 0):
        wanted = 1  # busy (or unknown) but keeping up: never scale a working group to zero
    return Recommendation(left, rate, ceiling, min(wanted, ceiling))
