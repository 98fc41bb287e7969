"""Where a publish goes: the routing snapshot and when to consult the cache.

:class:`~streamkit.publisher.routing_cache.RoutingCache` holds the rules
(sans-IO); :class:`~streamkit.publisher.refresher.RoutingRefresher` fetches
routing.  A :class:`Router` puts the two behind what the send loop needs:

* a :class:`RoutingSnapshot` (shard keys and the ``XADD`` arguments before
  the fields, per shard) that the hot path may route from without asking the
  cache until ``fast_until`` (the next refresh or the lease margin, whichever
  is first);
* the slow path (:meth:`Router.route`) for everything else: a refresh that
  is due is scheduled, one that is needed (no table, a stale route, the lease
  about to end) is waited for, and the cache enforces its rules;
* the answer to ``XADD NOMKSTREAM`` finding no stream (:meth:`Router.stale`):
  refresh at once and re-route, or fail with ``StaleRouteError``;
* the first routing (:meth:`Router.first_routing`), which also checks that
  every routed shard key is a stream.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Final

import anyio
from redis.exceptions import RedisError

from streamkit.connections import AsyncRedis
from streamkit.coordinator_client import CoordinatorError, CoordinatorUnavailable
from streamkit.group_hints import existing_groups_hint
from streamkit.publisher.encoding import PartitionKey, text
from streamkit.publisher.errors import (
    CoordinatorUnreachableError,
    PublishError,
    PublisherStartupError,
    ShardStreamsMissing,
    StaleRouteError,
    UnknownGroupError,
)
from streamkit.publisher.refresher import RefreshFlight, RoutingRefresher, RoutingSource
from streamkit.publisher.routing_cache import RoutingTable, RoutingUnavailable

__all__ = ["EMPTY", "Router", "RoutingSnapshot"]

log = logging.getLogger("streamkit.producer")


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    """The cached table in the shape the hot path wants."""

    table: RoutingTable | None
    version: int
    count: int
    keys: tuple[str, ...]
    #: Per shard, the XADD arguments before the fields.
    heads: tuple[tuple[Any, ...], ...]


EMPTY: Final = RoutingSnapshot(None, -1, 0, (), ())


class Router:
    """The routing of one publisher (stream prefix and group)."""

    def __init__(self, source: RoutingSource, *, maxlen: int | None) -> None:
        self.source = source
        # Copied out of ``source``: the publish path reads them per message.
        self.cache = source.cache
        self._clock = source.clock
        self._maxlen = maxlen
        self.refresher = RoutingRefresher(source, on_finished=self._refresh_finished)
        # Below this much lease left a publish waits for the refresh instead of
        # only scheduling it; a retry interval is the time one more try needs.
        self._margin = source.cache.retry_interval
        #: What the hot path routes with while the clock is below ``fast_until``.
        self.snap = EMPTY
        #: -inf sends the next publish down the slow path.
        self.fast_until = -math.inf
        self._missing: dict[str, tuple[int, float]] = {}  # key -> (version, confirmed at)
        #: Publishes that found a stale route and refreshed (metrics).
        self.stale_refreshes = 0
        #: Publishes refused for lack of a usable route (metrics).
        self.routing_failures = 0
        #: The first routing was fetched and checked (``start``).
        self.started = False
        self._start_lock = anyio.Lock()
        self._start_attempts = 0
        self._start_error: BaseException | None = None

    def invalidate(self) -> None:
        """Consult the cache on the next publish."""
        self.fast_until = -math.inf

    # -- the slow path -----------------------------------------------------------------

    async def route(self, partition_key: PartitionKey) -> RoutingSnapshot:
        """A snapshot fit for ``partition_key`` now (refreshing first if needed),
        or ``RoutingUnavailable``."""
        await self._refresh_if_due(self._clock())
        now = self._clock()
        try:
            self.cache.route(partition_key, now)  # the one place rules are enforced
        except RoutingUnavailable:
            self.routing_failures += 1
            raise
        snap = self._snapshot()
        self.fast_until = self._next_check(now)
        return snap

    async def _refresh_if_due(self, now: float) -> None:
        cache = self.cache
        if not cache.needs_refresh(now):
            return
        if not self.refresher.in_flight:
            if cache.refresh_deadline(now) > 0:
                return  # backing off after a failure; the lease decides what happens
            self.refresher.schedule()
        table = cache.table
        if table is None or cache.stale or now >= cache.lease_ends_at - self._margin:
            await self.refresher.refresh()  # joins the flight just scheduled

    def _next_check(self, now: float) -> float:
        """When the hot path must next consult the cache."""
        cache = self.cache
        table = cache.table
        if table is None or cache.stale or table.shard_count == 0:
            return -math.inf
        wait_from = cache.lease_ends_at - self._margin
        if self.refresher.in_flight:
            return wait_from  # its completion resets fast_until anyway
        return min(now + cache.refresh_deadline(now), wait_from)

    def _refresh_finished(self, flight: RefreshFlight) -> None:
        self.invalidate()  # re-read the cache on the next publish

    def _snapshot(self) -> RoutingSnapshot:
        table = self.cache.table
        snap = self.snap
        if table is None or table is snap.table:
            return snap
        if table.metadata_version != snap.version:
            self._missing.clear()
        heads = snap.heads if table.shard_keys == snap.keys else self._heads(table.shard_keys)
        snap = RoutingSnapshot(
            table, table.metadata_version, table.shard_count, table.shard_keys, heads
        )
        self.snap = snap
        return snap

    def _heads(self, keys: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
        trim: tuple[Any, ...] = () if self._maxlen is None else ("MAXLEN", "~", self._maxlen)
        return tuple(("XADD", key, "NOMKSTREAM", *trim, "*") for key in keys)

    # -- stale routes ------------------------------------------------------------------

    def note_metadata_version(self, version: int) -> None:
        """A newer ``metadataVersion`` seen elsewhere makes the route stale."""
        table = self.cache.table
        if table is not None and version > table.metadata_version:
            self.stale_refreshes += 1
            self.cache.mark_stale(self._clock())
            self.invalidate()

    async def stale(self, snap: RoutingSnapshot, index: int, seq: int, *, cooldown: float) -> None:
        """XADD NOMKSTREAM found no stream: refresh at once, or raise.

        Returns only when fresh routing differs from ``snap``, so a retry is
        re-routed. ``seq`` (refreshes started before the XADD was sent) lets
        concurrent publishes share one refresh that is recent enough. After
        fresh routing confirmed the key missing, publishes to it fail for
        ``cooldown`` seconds without asking the coordinator again.
        """
        table = self.cache.table
        if table is not None and table.metadata_version != snap.version:
            return  # routing moved on while this command was in the air
        key = snap.keys[index]
        now = self._clock()
        confirmed = self._missing.get(key)
        if confirmed is not None and confirmed[0] == snap.version and now - confirmed[1] < cooldown:
            # Fresh routing confirmed this very key missing a moment ago: do not
            # send the coordinator one request per publish to a dead shard.
            raise self.stale_error(snap, index, "the coordinator still routes to it")
        self.stale_refreshes += 1
        self.cache.mark_stale(now)
        self.invalidate()
        flight = await self.refresher.refresh(newer_than=seq)
        table = self.cache.table
        if table is not None and table.metadata_version != snap.version:
            return
        if flight.error is None:
            self._missing[key] = (snap.version, self._clock())
            raise self.stale_error(snap, index, "the coordinator still routes to it")
        raise self.stale_error(
            snap, index, f"routing could not be refreshed: {flight.error}"
        ) from flight.error

    def stale_error(self, snap: RoutingSnapshot, index: int, why: str) -> StaleRouteError:
        self.routing_failures += 1
        key = snap.keys[index]
        return StaleRouteError(
            f"shard stream {key!r} (shard {index} of {self.cache.name}, routing version "
            f"{snap.version}) does not exist; it was not recreated (XADD NOMKSTREAM) and "
            f"{why}",
            key,
            index,
            snap.version,
        )

    # -- the first routing -------------------------------------------------------------

    async def start(self, redis: AsyncRedis) -> None:
        """``first_routing`` once; concurrent callers share one attempt."""
        if self.started:
            return
        attempts = self._start_attempts
        async with self._start_lock:
            if self.started:
                return
            if self._start_attempts != attempts and self._start_error is not None:
                # The attempt we queued behind just failed: share its outcome
                # rather than hitting a coordinator that is down once per caller.
                raise self._start_error
            self._start_attempts += 1
            try:
                await self.first_routing(redis)
            except Exception as exc:
                self._start_error = exc
                raise
            self._start_error = None
            self.started = True

    async def first_routing(self, redis: AsyncRedis) -> None:
        """Fetch routing and check that every routed shard key is a stream."""
        flight = await self.refresher.refresh()
        if flight.error is not None:
            hint = ""
            if isinstance(flight.error, CoordinatorError) and flight.error.status_code == 404:
                hint = await existing_groups_hint(
                    self.source.coordinator, self.source.stream_prefix, self.source.consumer_group
                )
            error = self._startup_error(flight.error, hint)
            if isinstance(error, CoordinatorUnreachableError):
                # The message says what and where; the HTTP client's chain of
                # tracebacks under it would only bury that.
                raise error from None
            raise error from flight.error
        table = self.cache.table
        assert table is not None  # a successful first refresh always installs one
        if table.shard_count == 0:
            self.cache.route("", self._clock())  # raises RoutingUnavailable(no_shards)
        pipe = redis.pipeline(transaction=False)
        for key in table.shard_keys:
            pipe.type(key)
        try:
            kinds = [text(kind) for kind in await pipe.execute()]
        except (RedisError, OSError) as exc:
            raise PublisherStartupError(
                f"cannot reach Redis to check the shard streams of {self.cache.name}: "
                f"{type(exc).__name__}: {exc}; is redis-server running there? "
                "STREAMKIT_REDIS_URL sets the address",
                self.source.stream_prefix,
                self.source.consumer_group,
            ) from None
        found = {
            k: kind for k, kind in zip(table.shard_keys, kinds, strict=True) if kind != "stream"
        }
        if found:
            shown = ", ".join(f"{k} ({v})" for k, v in list(found.items())[:10])
            raise ShardStreamsMissing(
                f"{len(found)} of {table.shard_count} shard streams of {self.cache.name} "
                f"(routing version {table.metadata_version}) are not streams in Redis: {shown}. "
                "The publisher never creates shard streams; the coordinator provisions them.",
                self.source.stream_prefix,
                self.source.consumer_group,
                found,
            )
        log.info(
            "publisher for %s ready: %d shards, routing version %d",
            self.cache.name,
            table.shard_count,
            table.metadata_version,
        )

    def _startup_error(self, error: BaseException, hint: str = "") -> PublishError:
        name = f"stream {self.source.stream_prefix!r} / group {self.source.consumer_group!r}"
        if isinstance(error, CoordinatorError) and error.status_code == 404:
            return UnknownGroupError(
                f"the coordinator has no consumer group {self.source.consumer_group!r} for stream "
                f"{self.source.stream_prefix!r}; "
                + (f"{hint} Otherwise create" if hint else "create")
                + f" it before publishing: streamkit group create {self.source.stream_prefix} "
                f"{self.source.consumer_group}",
                self.source.stream_prefix,
                self.source.consumer_group,
            )
        kind = (
            CoordinatorUnreachableError
            if isinstance(error, CoordinatorUnavailable)
            else PublisherStartupError
        )
        return kind(
            f"cannot get producer routing for {name}: {error}",
            self.source.stream_prefix,
            self.source.consumer_group,
        )
