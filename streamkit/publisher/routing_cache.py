"""Producer routing cache for one ``(stream_prefix, consumer_group)``, sans-IO.

Producers have no heartbeat, so routing metadata refresh is the only way they
learn about a reshard, also while the coordinator or its Redis fails. The rules:

* refresh before the cache lease expires, and at once on a stale route;
* replace the table only with a newer ``metadataVersion``;
* keep the table if a refresh fails while the lease is valid;
* once the lease has expired, publishing fails (fail closed).

The caller owns I/O and the clock: it passes ``now`` (monotonic seconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from streamkit.errors import StreamkitError
from streamkit.routing import shard_for_key

__all__ = ["Route", "RoutingCache", "RoutingTable", "RoutingUnavailable"]

UnavailableReason = Literal["no_table", "lease_expired", "no_shards"]


class RoutingUnavailable(StreamkitError):
    """Publishing must fail: there is no routing metadata we may trust."""

    def __init__(self, message: str, reason: UnavailableReason) -> None:
        super().__init__(message)
        self.reason: UnavailableReason = reason  # stable label for metrics


@dataclass(frozen=True, slots=True)
class Route:
    """Where one message goes."""

    stream_key: str
    shard_index: int
    metadata_version: int


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """One producer-routing answer from the coordinator.

    ``fetched_at`` is when the answer was known to be current; the cache lease
    runs from it. Pass the time the request was *sent* to be conservative.
    """

    metadata_version: int
    shard_count: int
    stream_key_pattern: str
    shard_keys: tuple[str, ...]
    fetched_at: float

    def __post_init__(self) -> None:
        if self.metadata_version < 0:
            raise ValueError(f"metadata_version must be >= 0, got {self.metadata_version}")
        if self.shard_count < 0:
            raise ValueError(f"shard_count must be >= 0, got {self.shard_count}")
        if len(self.shard_keys) != self.shard_count:
            raise ValueError(
                f"{len(self.shard_keys)} shard keys for shard_count={self.shard_count}"
            )
        if not math.isfinite(self.fetched_at):
            raise ValueError(f"fetched_at must be finite, got {self.fetched_at}")

    @classmethod
    def from_wire(cls, resp: Mapping[str, Any], now: float) -> RoutingTable:
        """Build a table from the ``getProducerRoutingMetadata`` JSON body.

        Every shard index in ``0..shardCount-1`` must appear exactly once: a
        gap would leave keys with nowhere to go, a duplicate is ambiguous.
        Raises ``ValueError`` for any malformed body.
        """
        version = _wire_int(resp, "metadataVersion")
        count = _wire_int(resp, "shardCount")
        pattern = _wire_str(resp, "streamKeyPattern")
        shards = resp.get("shards")
        if not isinstance(shards, list):
            raise ValueError("producer routing: 'shards' must be a list")
        if count < 0:
            raise ValueError(f"producer routing: shardCount must be >= 0, got {count}")
        keys: list[str | None] = [None] * count
        for shard in shards:
            if not isinstance(shard, Mapping):
                raise ValueError("producer routing: each shard must be an object")
            index = _wire_int(shard, "shardIndex")
            key = _wire_str(shard, "streamKey")
            if not 0 <= index < count:
                raise ValueError(f"producer routing: shardIndex {index} outside 0..{count - 1}")
            if keys[index] is not None:
                raise ValueError(f"producer routing: shardIndex {index} listed twice")
            keys[index] = key
        missing = [i for i, k in enumerate(keys) if k is None]
        if missing:
            raise ValueError(f"producer routing: shard indexes {missing} missing")
        return cls(
            metadata_version=version,
            shard_count=count,
            stream_key_pattern=pattern,
            shard_keys=tuple(k for k in keys if k is not None),
            fetched_at=now,
        )


def _wire_int(obj: Mapping[str, Any], field: str) -> int:
    value = obj.get(field)
    # bool is an int subclass in Python but not an integer in JSON.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"producer routing: {field!r} must be an integer, got {value!r}")
    return value


def _wire_str(obj: Mapping[str, Any], field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str):
        raise ValueError(f"producer routing: {field!r} must be a string, got {value!r}")
    return value


class RoutingCache:
    """The routing table a producer may use, and when to refresh it.

    Times are monotonic seconds supplied by the caller. A table is usable from
    its ``fetched_at`` until ``fetched_at + lease``; a refresh is due from
    ``fetched_at + refresh_interval`` on, leaving ``lease - refresh_interval``
    for retries before publishing fails closed.
    """

    def __init__(
        self,
        refresh_interval: float,
        lease: float,
        *,
        retry_interval: float | None = None,
        name: str = "",
    ) -> None:
        if not (math.isfinite(refresh_interval) and refresh_interval > 0):
            raise ValueError(f"refresh_interval must be > 0, got {refresh_interval}")
        if not (math.isfinite(lease) and lease > refresh_interval):
            raise ValueError(
                f"lease ({lease}) must be greater than refresh_interval ({refresh_interval})"
                " so a failed refresh can be retried before the cache expires"
            )
        if retry_interval is None:
            # At least three retries fit between "refresh due" and "lease ends".
            retry_interval = min(refresh_interval, (lease - refresh_interval) / 3)
        if not (math.isfinite(retry_interval) and retry_interval > 0):
            raise ValueError(f"retry_interval must be > 0, got {retry_interval}")
        self.refresh_interval = refresh_interval
        self.lease = lease
        self.retry_interval = retry_interval
        self.name = name  # e.g. "orders/billing", used in error messages only
        self._table: RoutingTable | None = None
        self._stale = False
        self.highest_seen_version = 0
        # Counters for metrics; consecutive_failures resets on a good refresh.
        self.consecutive_failures = 0
        self.total_failures = 0
        self.older_responses = 0
        self.stale_marks = 0
        self.stale_since: float | None = None
        self.last_error: BaseException | str | None = None
        self.last_failure_at: float | None = None

    @property
    def table(self) -> RoutingTable | None:
        return self._table

    @property
    def stale(self) -> bool:
        return self._stale

    @property
    def lease_ends_at(self) -> float:
        """When the current table stops routing (-inf without one): the one
        place the routing lease is added up."""
        table = self._table
        return -math.inf if table is None else table.fetched_at + self.lease

    def lease_valid(self, now: float) -> bool:
        return now < self.lease_ends_at

    def age(self, now: float) -> float | None:
        """Seconds since the current table was confirmed; None without a table."""
        return None if self._table is None else now - self._table.fetched_at

    def needs_refresh(self, now: float) -> bool:
        if self._table is None or self._stale:
            return True
        return now >= self._table.fetched_at + self.refresh_interval

    def refresh_deadline(self, now: float) -> float:
        """Seconds a background loop should sleep before the next refresh.

        After a failure the loop waits ``retry_interval`` instead of spinning
        against a coordinator that is down. The publish path does not use this:
        on a stale route it refreshes at once.
        """
        if self.needs_refresh(now):
            due = now
        else:
            assert self._table is not None  # needs_refresh is True without one
            due = self._table.fetched_at + self.refresh_interval
        if self.consecutive_failures and self.last_failure_at is not None:
            due = max(due, self.last_failure_at + self.retry_interval)
        return max(0.0, due - now)

    def apply(self, table: RoutingTable, now: float) -> bool:
        """Offer a refresh result; return True iff it replaced the table.

        * newer version: replace; the stale flag clears.
        * same version: keep the table but renew its lease. The coordinator
          just confirmed that this version is still the current one, which is
          exactly what a lease certifies (refresh is idempotent by version).
        * older version: ignore and keep ours (Redis may have lost writes; we
          never go back). Counted in ``older_responses`` for alerting.

        The lease is anchored at ``min(table.fetched_at, now)`` so a caller
        cannot extend it past what its own clock vouches for.
        """
        anchor = min(table.fetched_at, now)
        version = table.metadata_version
        self.highest_seen_version = max(self.highest_seen_version, version)
        current = self._table
        if current is not None and version < current.metadata_version:
            self.older_responses += 1
            return False
        self.consecutive_failures = 0
        # An answer (even the same version) clears the stale flag: otherwise a
        # key the coordinator still routes would force a refresh on every call.
        self._stale = False
        self.stale_since = None
        if current is not None and version == current.metadata_version:
            # max(): a delayed duplicate answer must not move the lease backwards.
            renewed = max(current.fetched_at, anchor)
            self._table = replace(current, fetched_at=renewed)
            return False
        self._table = replace(table, fetched_at=anchor)
        return True

    def refresh_failed(self, now: float, error: BaseException | str) -> None:
        """Record a failed refresh; the table stays usable inside its lease."""
        self.consecutive_failures += 1
        self.total_failures += 1
        self.last_error = error
        self.last_failure_at = now

    def mark_stale(self, now: float) -> None:
        """A publish hit a stale route (``XADD NOMKSTREAM`` found no stream, or
        a version mismatch): force a refresh.

        The table keeps routing inside its lease. Keeping one rule (the lease)
        for when routing stops is simpler and fails closed just the same; the
        caller refreshes, then retries the publish with the new route.
        """
        if not self._stale:
            self.stale_since = now
        self._stale = True
        self.stale_marks += 1

    def route(self, partition_key: str | bytes, now: float) -> Route:
        """Return the route for a key, or raise ``RoutingUnavailable``."""
        table = self._table
        label = f" for {self.name}" if self.name else ""
        if table is None:
            raise RoutingUnavailable(f"no producer routing metadata{label} yet", reason="no_table")
        if now >= self.lease_ends_at:
            raise RoutingUnavailable(
                f"producer routing lease{label} expired {now - table.fetched_at:.3f}s after "
                f"the last successful refresh (version {table.metadata_version}); "
                f"last refresh error: {self.last_error!r}",
                reason="lease_expired",
            )
        if table.shard_count == 0:
            raise RoutingUnavailable(
                f"stream{label} has no shards (drained or scaled to zero) "
                f"at metadata version {table.metadata_version}",
                reason="no_shards",
            )
        index = shard_for_key(partition_key, table.shard_count)
        return Route(table.shard_keys[index], index, table.metadata_version)
