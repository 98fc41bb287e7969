"""Publishing to the shard streams of one logical stream (SPEC §4).

A :class:`Publisher` routes each message by its partition key to a shard
stream with the coordinator's producer routing, and appends it with
``XADD key NOMKSTREAM [MAXLEN ~ n] * field value ...``: a retired or unknown
shard key makes the command fail instead of silently recreating the stream.

Delivery is **at-least-once**. A command that fails with a connection error or
a timeout may still have been applied by Redis before the connection broke,
and a retry then appends a second copy (with a different record id). Stale
routes are retried too, re-routed with fresh metadata; a key whose shard count
changed in between may land in another shard than its first copy. Consumers
must be idempotent (SPEC §5), which they have to be anyway.

Routing freshness (who refreshes when; rules in ``streamkit.publisher.routing_cache``):

* the first use (``start()``, or the first publish) fetches routing and checks
  that every shard stream exists, failing fast with a clear error otherwise;
* once the refresh interval has passed, the next publish *schedules* a refresh
  (a short task, single-flight) and goes on with the cached table;
* only when there is nothing safe to route with (no table, a route known to be
  stale, or the lease about to end) does a publish *wait* for that refresh;
* ``XADD NOMKSTREAM`` answering nil (the shard stream is gone) refreshes at
  once and re-routes; if the coordinator still routes to the missing key the
  publish fails with :class:`StaleRouteError`;
* after the lease has expired without a successful refresh every publish fails
  with :class:`~streamkit.publisher.routing_cache.RoutingUnavailable` (fail closed).

An idle publisher sends nothing; its next publish after the lease has run out
waits for one refresh first.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, ParamSpec, Self, TypeAlias, TypeVar

import anyio
import pydantic
import redis.exceptions
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from streamkit.connections import AsyncRedis, connect_redis, send_command, send_commands
from streamkit.coordinator_client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from streamkit.errors import StreamkitError
from streamkit.group_hints import existing_groups_hint
from streamkit.middleware import Middleware, PublishContext, PublishManyContext, chain
from streamkit.publisher.coalescer import CommandCoalescer
from streamkit.publisher.refresher import RefreshFlight, RoutingRefresher
from streamkit.publisher.routing_cache import RoutingCache, RoutingTable, RoutingUnavailable
from streamkit.routing import shard_for_key
from streamkit.settings import StreamKitSettings

__all__ = [
    "CoordinatorUnreachableError",
    "FieldValue",
    "Fields",
    "PartitionKey",
    "PublishBatchError",
    "PublishError",
    "PublishResult",
    "Publisher",
    "PublisherClosedError",
    "PublisherStartupError",
    "RoutingUnavailable",
    "ShardStreamsMissing",
    "StaleRouteError",
    "UnknownGroupError",
    "publish_result",
]

log = logging.getLogger("streamkit.producer")

PartitionKey: TypeAlias = str | bytes
FieldValue: TypeAlias = str | bytes | int | float
# Mapping is invariant in its key type: spell out the common key types so a
# plain dict[str, str] type-checks.
# A pydantic model is published as its JSON in the ``payload`` field (what
# ``publish_json`` writes and typed handlers decode).
Fields: TypeAlias = (
    Mapping[str, FieldValue]
    | Mapping[bytes, FieldValue]
    | Mapping[str | bytes, FieldValue]
    | pydantic.BaseModel
)
#: The field ``publish_json`` (and ``publish`` of a model) writes the JSON to.
PAYLOAD_FIELD: Final = "payload"

_TRACER: Final = trace.get_tracer("streamkit")
_EXACT_VALUE_TYPES: Final = frozenset({str, bytes, int, float})
# Errors after which the command may or may not have been applied: retrying is
# what makes delivery at-least-once instead of at-most-once.
_RETRYABLE: Final = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


# -- results and errors --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a message was appended."""

    stream_key: str
    shard_index: int
    record_id: str
    #: Routing metadata version the message was routed with.
    metadata_version: int


class PublishError(StreamkitError):
    """Base class of the publisher's own errors."""


class PublisherClosedError(PublishError):
    """``publish`` after ``aclose()``."""


class PublisherStartupError(PublishError):
    """The publisher could not get usable routing for its stream and group."""

    def __init__(self, message: str, stream_prefix: str, consumer_group: str) -> None:
        super().__init__(message)
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group


class CoordinatorUnreachableError(PublisherStartupError):
    """The coordinator could not be reached for the first routing (its message
    names the address and ``STREAMKIT_COORDINATOR_URL``)."""


class UnknownGroupError(PublisherStartupError):
    """The coordinator has no such group (404): it was never created, or deleted."""


class ShardStreamsMissing(PublisherStartupError):
    """Routed shard keys that are not streams in Redis (missing or another type)."""

    def __init__(
        self, message: str, stream_prefix: str, consumer_group: str, found: Mapping[str, str]
    ) -> None:
        super().__init__(message, stream_prefix, consumer_group)
        #: shard key -> what Redis has there (``"none"`` when the key is missing).
        self.found = dict(found)


class StaleRouteError(PublishError):
    """The routed shard stream does not exist and fresh routing still points to it."""

    def __init__(self, message: str, stream_key: str, shard_index: int, version: int) -> None:
        super().__init__(message)
        self.stream_key = stream_key
        self.shard_index = shard_index
        self.metadata_version = version


class PublishBatchError(PublishError):
    """``publish_many`` published some messages but not all.

    When nothing at all was published, the error itself is raised instead.
    """

    def __init__(
        self, results: Sequence[PublishResult | None], errors: Mapping[int, BaseException]
    ) -> None:
        first = min(errors)
        super().__init__(
            f"{len(errors)} of {len(results)} messages were not published "
            f"(first: #{first}: {errors[first]!r})"
        )
        #: In input order; None where the message was not published.
        self.results = list(results)
        #: Input index -> why that message was not published.
        self.errors = dict(errors)


# -- field validation ----------------------------------------------------------------


def _field_args(fields: Fields) -> list[Any]:
    """Flatten ``fields`` into XADD arguments, rejecting what Redis cannot store.

    Exact types are checked first: this runs on every publish.
    """
    if not isinstance(fields, Mapping):
        if isinstance(fields, pydantic.BaseModel):
            return [PAYLOAD_FIELD, fields.model_dump_json()]
        raise TypeError(f"fields must be a mapping of field -> value, got {type(fields).__name__}")
    args: list[Any] = []
    for name, value in fields.items():
        if type(name) is not str and type(name) is not bytes:
            _check_name(name)
        if type(value) not in _EXACT_VALUE_TYPES:
            value = _coerce_value(name, value)
        args.append(name)
        args.append(value)
    if not args:
        raise ValueError("fields must not be empty: a stream entry needs at least one field")
    return args


def _check_name(name: object) -> None:
    if not isinstance(name, str | bytes):
        raise TypeError(f"field names must be str or bytes, got {type(name).__name__}: {name!r}")


def _coerce_value(name: object, value: object) -> FieldValue:
    # bool is an int subclass, but True would be stored as "True": refuse it.
    if isinstance(value, str | bytes):
        return value  # subclasses (StrEnum): redis-py encodes their content
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # IntEnum & co.: redis-py would store their repr()
    if isinstance(value, float):
        return float(value)
    raise TypeError(
        f"field {name!r}: a value of type {type(value).__name__} cannot be stored in a stream "
        "entry; use str, bytes, int or float (serialize objects yourself, or use publish_json)"
    )


# -- the publisher -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The cached table in the shape the hot path wants."""

    table: RoutingTable | None
    version: int
    count: int
    keys: tuple[str, ...]
    #: Per shard, the XADD arguments before the fields.
    heads: tuple[tuple[Any, ...], ...]


_EMPTY: Final = _Snapshot(None, -1, 0, (), ())


class Publisher:
    """Publish messages to the shard streams of ``stream_prefix``.

    ``consumer_group`` names the coordinator group whose producer routing is
    used. Clients passed in are shared and never closed here; clients created
    from ``settings`` are closed by :meth:`aclose`. Nothing connects before the
    first :meth:`start` or publish. ``clock`` (monotonic seconds) drives the
    routing cache; tests inject a controllable one.

    Concurrent :meth:`publish` calls are sent as one pipeline
    (``streamkit.publisher.coalescer``; ``coalesce=False`` turns that off): a lone call
    goes out at once, calls made while one is in the air wait one event-loop
    turn (or ``coalesce_window`` seconds) for others to join. Each call gets
    its own result and its own error.

    Counters for metrics: ``published``, ``retries`` (re-sent messages),
    ``stale_refreshes`` (publishes that found a stale route and refreshed),
    ``routing_failures`` (publishes refused for lack of a usable route).
    """

    #: Attempts per message for connection errors and stale routes.
    max_attempts: int = 3
    #: First pause before a retry after a connection error (doubles, max 1 s).
    retry_backoff: float = 0.05
    #: ``publish_many`` sends at most this many messages per pipeline.
    max_batch: int = 1000
    #: After fresh routing confirmed a missing shard stream, fail publishes to it
    #: for this long without asking the coordinator again.
    stale_route_cooldown: float = 1.0

    def __init__(
        self,
        stream_prefix: str,
        consumer_group: str,
        *,
        settings: StreamKitSettings | None = None,
        coordinator: CoordinatorClient | None = None,
        redis: AsyncRedis | None = None,
        maxlen: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        middlewares: Sequence[Middleware] = (),
        trace_context_field: str | None = "traceparent",
        coalesce: bool = True,
        coalesce_window: float = 0.0,
    ) -> None:
        if maxlen is not None and maxlen < 0:
            raise ValueError(f"maxlen must be >= 0, got {maxlen}")
        settings = settings or StreamKitSettings()
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group
        self.maxlen = maxlen
        self._clock = clock
        # No I/O here: both clients connect on first use.
        self._owns_coordinator = coordinator is None
        self._coordinator = coordinator or CoordinatorClient.from_settings(settings)
        self._owns_redis = redis is None
        self._redis: AsyncRedis = redis or connect_redis(
            settings.redis_url,
            cluster=settings.redis_cluster,
            connect_timeout=settings.redis_connect_timeout,
            socket_timeout=settings.redis_socket_timeout,
        )
        self._cache = RoutingCache(
            settings.routing_refresh_interval,
            settings.routing_lease,
            name=f"{stream_prefix}/{consumer_group}",
        )
        # Below this much lease left a publish waits for the refresh instead of
        # only scheduling it; a retry interval is the time one more try needs.
        self._margin = self._cache.retry_interval
        self._refresher = RoutingRefresher(
            self._cache,
            self._coordinator,
            stream_prefix,
            consumer_group,
            clock=clock,
            on_finished=self._refresh_finished,
        )
        # Concurrent publish() calls share one pipeline (streamkit.publisher.coalescer);
        # off, each call is its own round trip.
        self._coalescer: CommandCoalescer | None = (
            CommandCoalescer(
                functools.partial(send_command, self._redis),
                self._send_pipeline,
                window=coalesce_window,
                max_batch=self.max_batch,
            )
            if coalesce
            else None
        )
        self._snap = _EMPTY
        # Until this clock value the hot path may route from `_snap` without
        # consulting the cache; -inf sends the next publish down the slow path.
        self._fast_until = -math.inf
        self._missing: dict[str, tuple[int, float]] = {}  # key -> (version, confirmed at)
        self._started = False
        self._closed = False
        self._start_lock = anyio.Lock()
        self._start_attempts = 0
        self._start_error: BaseException | None = None
        self._span_name = f"publish {stream_prefix}"
        self._tracer: trace.Tracer = _TRACER
        self._tracing = _global_tracing()
        #: Wrap every publish / publish_many (``streamkit.middleware``).  Kept
        #: as given: an app's publishers share (and see later additions to) its list.
        self.middlewares = middlewares
        #: Entry field carrying the W3C ``traceparent`` of the producer span
        #: (consumers link their span to it); None: not written.
        self.trace_context_field = trace_context_field
        self.published = 0
        self.retries = 0
        self.stale_refreshes = 0
        self.routing_failures = 0

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Fetch routing and check that every shard stream exists.

        Raises :class:`UnknownGroupError` when the coordinator does not know
        the group, :class:`ShardStreamsMissing` when a routed shard key is not
        a stream, :class:`RoutingUnavailable` when the stream has no shards and
        :class:`PublisherStartupError` when the coordinator cannot be used.
        Idempotent; concurrent callers share one attempt.
        """
        if self._closed:
            raise PublisherClosedError(f"publisher for {self._cache.name} is closed")
        if self._started:
            return
        attempts = self._start_attempts
        async with self._start_lock:
            if self._started:
                return
            if self._start_attempts != attempts and self._start_error is not None:
                # The attempt we queued behind just failed: share its outcome
                # rather than hitting a coordinator that is down once per caller.
                raise self._start_error
            self._start_attempts += 1
            try:
                await self._start_once()
            except Exception as exc:
                self._start_error = exc
                raise
            self._start_error = None
            self._started = True

    async def _start_once(self) -> None:
        flight = await self._refresher.refresh()
        if flight.error is not None:
            hint = ""
            if isinstance(flight.error, CoordinatorError) and flight.error.status_code == 404:
                hint = await existing_groups_hint(
                    self._coordinator, self.stream_prefix, self.consumer_group
                )
            error = self._startup_error(flight.error, hint)
            if isinstance(error, CoordinatorUnreachableError):
                # The message says what and where; the HTTP client's chain of
                # tracebacks under it would only bury that.
                raise error from None
            raise error from flight.error
        table = self._cache.table
        assert table is not None  # a successful first refresh always installs one
        if table.shard_count == 0:
            self._cache.route("", self._clock())  # raises RoutingUnavailable(no_shards)
        pipe = self._redis.pipeline(transaction=False)
        for key in table.shard_keys:
            pipe.type(key)
        try:
            kinds = [_text(kind) for kind in await pipe.execute()]
        except (redis.exceptions.RedisError, OSError) as exc:
            raise PublisherStartupError(
                f"cannot reach Redis to check the shard streams of {self._cache.name}: "
                f"{type(exc).__name__}: {exc}; is redis-server running there? "
                "STREAMKIT_REDIS_URL sets the address",
                self.stream_prefix,
                self.consumer_group,
            ) from None
        found = {
            k: kind for k, kind in zip(table.shard_keys, kinds, strict=True) if kind != "stream"
        }
        if found:
            shown = ", ".join(f"{k} ({v})" for k, v in list(found.items())[:10])
            raise ShardStreamsMissing(
                f"{len(found)} of {table.shard_count} shard streams of {self._cache.name} "
                f"(routing version {table.metadata_version}) are not streams in Redis: {shown}. "
                "The publisher never creates shard streams; the coordinator provisions them.",
                self.stream_prefix,
                self.consumer_group,
                found,
            )
        log.info(
            "publisher for %s ready: %d shards, routing version %d",
            self._cache.name,
            table.shard_count,
            table.metadata_version,
        )

    def _startup_error(self, error: BaseException, hint: str = "") -> PublishError:
        name = f"stream {self.stream_prefix!r} / group {self.consumer_group!r}"
        if isinstance(error, CoordinatorError) and error.status_code == 404:
            return UnknownGroupError(
                f"the coordinator has no consumer group {self.consumer_group!r} for stream "
                f"{self.stream_prefix!r}; "
                + (f"{hint} Otherwise create" if hint else "create")
                + f" it before publishing: streamkit group create {self.stream_prefix} "
                f"{self.consumer_group}",
                self.stream_prefix,
                self.consumer_group,
            )
        kind = (
            CoordinatorUnreachableError
            if isinstance(error, CoordinatorUnavailable)
            else PublisherStartupError
        )
        return kind(
            f"cannot get producer routing for {name}: {error}",
            self.stream_prefix,
            self.consumer_group,
        )

    async def aclose(self) -> None:
        """Stop the refresh in the air and close the clients created here."""
        if self._closed:
            return
        self._closed = True
        self._fast_until = -math.inf
        await self._refresher.aclose()
        if self._owns_redis:
            await self._redis.aclose()
        if self._owns_coordinator:
            await self._coordinator.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- publishing ------------------------------------------------------------------

    async def publish(self, partition_key: PartitionKey, fields: Fields) -> PublishResult:
        """Append one message to the shard of ``partition_key`` (at-least-once).

        ``fields`` is a mapping of field names to values, or a pydantic model,
        which is written as JSON in the ``payload`` field (as ``publish_json``).

        Raises ``TypeError`` for field values that are not str, bytes, int or
        float, :class:`RoutingUnavailable` when no trusted routing exists (fail
        closed), :class:`StaleRouteError` when the routed shard stream is gone
        and fresh routing still points to it, and the redis-py error after
        ``max_attempts`` connection failures.
        """
        if not self.middlewares:
            return await self._publish_spanned(partition_key, fields)
        ctx = PublishContext(partition_key, fields, self.stream_prefix, self.consumer_group)
        return await chain(
            self.middlewares,
            "publish",
            ctx,
            lambda: self._publish_spanned(ctx.partition_key, ctx.fields),
        )

    async def _publish_spanned(self, partition_key: PartitionKey, fields: Fields) -> PublishResult:
        args = _field_args(fields)
        if not self._tracing:  # no tracer provider configured: no span at all
            return await self._publish(partition_key, args)
        span = self._tracer.start_span(self._span_name, kind=SpanKind.PRODUCER)
        if self.trace_context_field and span.get_span_context().is_valid:
            # Sampled out too: the entry carries the decision (flags 00), so
            # consumers follow it instead of each sampling on their own.
            args = [*args, self.trace_context_field, traceparent(span)]
        if not span.is_recording():
            return await self._publish(partition_key, args)
        with trace.use_span(span, end_on_exit=True):
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.operation.type", "send")
            result = await self._publish(partition_key, args)
            span.set_attribute("messaging.destination.name", result.stream_key)
            span.set_attribute("streamkit.shard_index", result.shard_index)
            span.set_attribute("streamkit.metadata_version", result.metadata_version)
            return result

    async def _publish(self, partition_key: PartitionKey, args: list[Any]) -> PublishResult:
        attempt = 1
        while True:
            if self._clock() < self._fast_until:
                snap = self._snap
                index = shard_for_key(partition_key, snap.count)
            else:
                snap, index = await self._route_slow(partition_key)
            seq = self._refresher.started
            try:
                if self._coalescer is None:
                    reply = await send_command(self._redis, *snap.heads[index], *args)
                else:
                    reply = await self._coalescer.execute(*snap.heads[index], *args)
            except _RETRYABLE as exc:
                if attempt >= self.max_attempts or _fatal(exc):
                    raise
                await self._backoff(attempt, 1)
            else:
                if reply is not None:
                    self.published += 1
                    return PublishResult(snap.keys[index], index, _text(reply), snap.version)
                await self._stale_route(snap, index, seq)  # raises unless routing moved on
                if attempt >= self.max_attempts:
                    raise self._stale_error(snap, index, "routing kept changing")
                self.retries += 1
            attempt += 1

    async def _send_pipeline(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        return await send_commands(self._redis, commands)

    async def publish_many(
        self, items: Iterable[tuple[PartitionKey, Fields]]
    ) -> list[PublishResult]:
        """Publish many messages with one pipelined round trip per batch.

        Messages are routed like :meth:`publish` and sent ``max_batch`` at a
        time in one non-transactional pipeline; redis-py sends it as one round
        trip on standalone Redis and one per primary (in parallel) on a
        cluster, so each shard gets at most one round trip per batch. Order is
        kept per shard, and results come back in input order. Every field is
        checked before anything is sent. One span per batch.

        If only some messages could be published, raises
        :class:`PublishBatchError` with the per-message outcome; if none was,
        raises the error itself.
        """
        if not self.middlewares:
            return await self._publish_many(items)
        ctx = PublishManyContext(list(items), self.stream_prefix, self.consumer_group)
        return await chain(
            self.middlewares, "publish_many", ctx, lambda: self._publish_many(ctx.items)
        )

    async def _publish_many(
        self, items: Iterable[tuple[PartitionKey, Fields]]
    ) -> list[PublishResult]:
        batch = [(key, _field_args_at(i, fields)) for i, (key, fields) in enumerate(items)]
        results: list[PublishResult | None] = [None] * len(batch)
        errors: dict[int, BaseException] = {}
        for lo in range(0, len(batch), self.max_batch):
            hi = min(lo + self.max_batch, len(batch))
            try:
                await self._publish_chunk_traced(batch, list(range(lo, hi)), results, errors)
            except Exception as exc:  # stop at the first chunk that cannot be sent
                for i in range(lo, len(batch)):
                    if results[i] is None:
                        errors.setdefault(i, exc)
                break
        if not errors:
            return [r for r in results if r is not None]
        if all(r is None for r in results):
            raise errors[min(errors)]
        raise PublishBatchError(results, errors)

    async def publish_json(
        self,
        partition_key: PartitionKey,
        obj: Any,
        field: str = PAYLOAD_FIELD,
    ) -> PublishResult:
        """Publish ``obj`` as compact JSON in one field (pydantic models dumped by pydantic).

        A listener whose handler is typed with a pydantic model decodes this field.
        """
        if isinstance(obj, pydantic.BaseModel):
            payload = obj.model_dump_json()
        else:
            payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        return await self.publish(partition_key, {field: payload})

    def note_metadata_version(self, version: int) -> None:
        """Report a ``metadataVersion`` seen elsewhere (e.g. a consumer heartbeat).

        If it is newer than the routing in use, the route is stale: the next
        publish refreshes before sending.
        """
        table = self._cache.table
        if table is not None and version > table.metadata_version:
            self.stale_refreshes += 1
            self._cache.mark_stale(self._clock())
            self._fast_until = -math.inf

    # -- observability ---------------------------------------------------------------

    @property
    def tracer(self) -> trace.Tracer:
        """Where spans go; by default ``trace.get_tracer("streamkit")``.

        With the default, a tracer provider installed after the publisher was
        created is noticed within one routing refresh interval.
        """
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._tracing = True

    @property
    def coalescer(self) -> CommandCoalescer | None:
        """What turns concurrent ``publish`` calls into pipelines (None when off)."""
        return self._coalescer

    @property
    def routing_cache(self) -> RoutingCache:
        """The cache itself (read it, do not drive it): version, age, failure counters."""
        return self._cache

    @property
    def refresher(self) -> RoutingRefresher:
        """Refresh counters: ``started`` (requests), ``refreshes``, ``replacements``."""
        return self._refresher

    @property
    def metadata_version(self) -> int | None:
        table = self._cache.table
        return None if table is None else table.metadata_version

    # -- routing ---------------------------------------------------------------------

    async def _route_slow(self, partition_key: PartitionKey) -> tuple[_Snapshot, int]:
        """Everything the hot path skips: start, refresh, lease and shard checks."""
        if self._closed:
            raise PublisherClosedError(f"publisher for {self._cache.name} is closed")
        if not self._started:
            await self.start()
        if self._tracer is _TRACER:
            # Not on the hot path (0.8 us: it reads the environment); the slow
            # path runs at least once per refresh interval while publishing.
            self._tracing = _global_tracing()
        await self._refresh_if_due(self._clock())
        now = self._clock()
        try:
            route = self._cache.route(partition_key, now)  # the one place rules are enforced
        except RoutingUnavailable:
            self.routing_failures += 1
            raise
        snap = self._snapshot()
        self._fast_until = self._next_check(now)
        return snap, route.shard_index

    async def _refresh_if_due(self, now: float) -> None:
        cache = self._cache
        if not cache.needs_refresh(now):
            return
        if not self._refresher.in_flight:
            if cache.refresh_deadline(now) > 0:
                return  # backing off after a failure; the lease decides what happens
            self._refresher.schedule()
        table = cache.table
        if table is None or cache.stale or now >= cache.lease_ends_at - self._margin:
            await self._refresher.refresh()  # joins the flight just scheduled

    def _next_check(self, now: float) -> float:
        """When the hot path must next consult the cache."""
        cache = self._cache
        table = cache.table
        if table is None or cache.stale or table.shard_count == 0:
            return -math.inf
        wait_from = cache.lease_ends_at - self._margin
        if self._refresher.in_flight:
            return wait_from  # its completion resets _fast_until anyway
        return min(now + cache.refresh_deadline(now), wait_from)

    def _refresh_finished(self, flight: RefreshFlight) -> None:
        self._fast_until = -math.inf  # re-read the cache on the next publish

    def _snapshot(self) -> _Snapshot:
        table = self._cache.table
        snap = self._snap
        if table is None or table is snap.table:
            return snap
        if table.metadata_version != snap.version:
            self._missing.clear()
        heads = snap.heads if table.shard_keys == snap.keys else self._heads(table.shard_keys)
        snap = _Snapshot(table, table.metadata_version, table.shard_count, table.shard_keys, heads)
        self._snap = snap
        return snap

    def _heads(self, keys: tuple[str, ...]) -> tuple[tuple[Any, ...], ...]:
        trim: tuple[Any, ...] = () if self.maxlen is None else ("MAXLEN", "~", self.maxlen)
        return tuple(("XADD", key, "NOMKSTREAM", *trim, "*") for key in keys)

    async def _stale_route(self, snap: _Snapshot, index: int, seq: int) -> None:
        """XADD NOMKSTREAM found no stream: refresh at once, or raise.

        Returns only when fresh routing differs from ``snap``, so a retry is
        re-routed. ``seq`` (refreshes started before the XADD was sent) lets
        concurrent publishes share one refresh that is recent enough.
        """
        table = self._cache.table
        if table is not None and table.metadata_version != snap.version:
            return  # routing moved on while this command was in the air
        key = snap.keys[index]
        now = self._clock()
        confirmed = self._missing.get(key)
        if (
            confirmed is not None
            and confirmed[0] == snap.version
            and now - confirmed[1] < self.stale_route_cooldown
        ):
            # Fresh routing confirmed this very key missing a moment ago: do not
            # send the coordinator one request per publish to a dead shard.
            raise self._stale_error(snap, index, "the coordinator still routes to it")
        self.stale_refreshes += 1
        self._cache.mark_stale(now)
        self._fast_until = -math.inf
        flight = await self._refresher.refresh(newer_than=seq)
        table = self._cache.table
        if table is not None and table.metadata_version != snap.version:
            return
        if flight.error is None:
            self._missing[key] = (snap.version, self._clock())
            raise self._stale_error(snap, index, "the coordinator still routes to it")
        raise self._stale_error(
            snap, index, f"routing could not be refreshed: {flight.error}"
        ) from flight.error

    def _stale_error(self, snap: _Snapshot, index: int, why: str) -> StaleRouteError:
        self.routing_failures += 1
        key = snap.keys[index]
        return StaleRouteError(
            f"shard stream {key!r} (shard {index} of {self._cache.name}, routing version "
            f"{snap.version}) does not exist; it was not recreated (XADD NOMKSTREAM) and "
            f"{why}",
            key,
            index,
            snap.version,
        )

    async def _backoff(self, attempt: int, messages: int) -> None:
        self.retries += messages
        await anyio.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 1.0))

    # -- batches ---------------------------------------------------------------------

    async def _publish_chunk_traced(
        self,
        batch: list[tuple[PartitionKey, list[Any]]],
        pending: list[int],
        results: list[PublishResult | None],
        errors: dict[int, BaseException],
    ) -> None:
        span = (
            self._tracer.start_span(self._span_name, kind=SpanKind.PRODUCER)
            if self._tracing
            else None
        )
        if span is None:
            await self._publish_chunk(batch, pending, results, errors)
            return
        if self.trace_context_field and span.get_span_context().is_valid:
            # Also when sampled out: the decision travels with the entries.
            extra = [self.trace_context_field, traceparent(span)]
            for i in pending:
                batch[i] = (batch[i][0], [*batch[i][1], *extra])
        if not span.is_recording():
            await self._publish_chunk(batch, pending, results, errors)
            return
        with trace.use_span(span, end_on_exit=True):
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.operation.type", "send")
            span.set_attribute("messaging.destination.name", self.stream_prefix)
            span.set_attribute("messaging.batch.message_count", len(pending))
            await self._publish_chunk(batch, pending, results, errors)
            if self._snap.version >= 0:
                span.set_attribute("streamkit.metadata_version", self._snap.version)

    async def _publish_chunk(
        self,
        batch: list[tuple[PartitionKey, list[Any]]],
        pending: list[int],
        results: list[PublishResult | None],
        errors: dict[int, BaseException],
    ) -> None:
        attempt = 1
        while pending:
            if self._clock() < self._fast_until:
                snap = self._snap
            else:
                snap, _ = await self._route_slow(batch[pending[0]][0])
            seq = self._refresher.started
            count, heads = snap.count, snap.heads
            shards: list[int] = []
            commands: list[tuple[Any, ...]] = []
            for i in pending:
                key, args = batch[i]
                index = shard_for_key(key, count)
                shards.append(index)
                commands.append((*heads[index], *args))
            try:
                replies = await send_commands(self._redis, commands)
            except _RETRYABLE as exc:
                if attempt >= self.max_attempts or _fatal(exc):
                    raise
                await self._backoff(attempt, len(pending))
                attempt += 1
                continue
            retry: list[int] = []
            stale: dict[int, list[int]] = {}  # shard -> input indexes
            for i, index, reply in zip(pending, shards, replies, strict=True):
                if reply is None:
                    stale.setdefault(index, []).append(i)
                elif isinstance(reply, BaseException):
                    if attempt < self.max_attempts and isinstance(reply, _RETRYABLE):
                        retry.append(i)
                    else:
                        errors[i] = reply
                else:
                    results[i] = PublishResult(snap.keys[index], index, _text(reply), snap.version)
                    self.published += 1
            for index, indexes in stale.items():
                try:
                    await self._stale_route(snap, index, seq)
                    if attempt >= self.max_attempts:
                        raise self._stale_error(snap, index, "routing kept changing")
                except StaleRouteError as exc:
                    for i in indexes:
                        errors[i] = exc
                    continue
                retry.extend(indexes)
            if retry:
                self.retries += len(retry)
            pending = sorted(retry)  # keep input order among the retried
            attempt += 1


def _field_args_at(position: int, fields: Fields) -> list[Any]:
    try:
        return _field_args(fields)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"message #{position}: {exc}") from None


def traceparent(span: trace.Span) -> str:
    """The W3C ``traceparent`` header value naming ``span`` as the parent."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _global_tracing() -> bool:
    """Whether a real tracer provider is installed globally."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _fatal(exc: BaseException) -> bool:
    # A wrong password is a ConnectionError subclass, but retrying cannot fix it.
    return isinstance(exc, redis.exceptions.AuthenticationError)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- handler helper ------------------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def publish_result(
    publisher: Publisher,
    key: Callable[[R], PartitionKey],
    *,
    field: str = "payload",
    as_fields: bool = False,
) -> Callable[[Callable[P, Awaitable[R | None]]], Callable[P, Awaitable[R | None]]]:
    """Decorate an async handler so that its return value is also published.

    ``key(result)`` gives the partition key. The result is published as JSON in
    ``field`` (see :meth:`Publisher.publish_json`), or, with ``as_fields=True``,
    as the entry's fields (it must then be a mapping). ``None`` publishes
    nothing. The result is returned unchanged, after it was published; if
    publishing fails the handler call fails (and is retried by its caller).
    """

    def decorate(handler: Callable[P, Awaitable[R | None]]) -> Callable[P, Awaitable[R | None]]:
        @functools.wraps(handler)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            result = await handler(*args, **kwargs)
            if result is None:
                return None
            if as_fields:
                if not isinstance(result, Mapping):
                    raise TypeError(
                        f"{handler.__qualname__} returned {type(result).__name__}, "
                        "not a mapping of fields"
                    )
                await publisher.publish(key(result), result)
            else:
                await publisher.publish_json(key(result), result, field)
            return result

        return wrapper

    return decorate
