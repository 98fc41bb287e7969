"""Publishing to the shard streams of one logical stream: :class:`Publisher`.

Each message is routed by its partition key (``streamkit.publisher.router``)
and appended with ``XADD key NOMKSTREAM [MAXLEN ~ n] * ...``, so a retired
shard key fails instead of being recreated; ``publish`` and ``publish_many``
share one send loop.  Delivery is at-least-once: a retry after a connection
error may append a second copy (docs/producer.md).  How the parts fit:
docs/architecture.md ("The publisher").
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Final, Self

import anyio
import redis.exceptions
from opentelemetry import trace

from streamkit.connections import AsyncRedis, connect_redis, send_command, send_commands
from streamkit.coordinator_client import CoordinatorClient
from streamkit.middleware import Middleware, PublishContext, PublishManyContext, chain
from streamkit.publisher.coalescer import CommandCoalescer
from streamkit.publisher.decorator import publish_result
from streamkit.publisher.encoding import (
    PAYLOAD_FIELD,
    Fields,
    FieldValue,
    PartitionKey,
    field_args,
    field_args_at,
    json_payload,
    text,
)
from streamkit.publisher.errors import (
    CoordinatorUnreachableError,
    PublishBatchError,
    PublisherClosedError,
    PublishError,
    PublisherStartupError,
    RoutingUnavailable,
    ShardStreamsMissing,
    StaleRouteError,
    UnknownGroupError,
)
from streamkit.publisher.refresher import RoutingRefresher
from streamkit.publisher.router import Router, RoutingSnapshot
from streamkit.publisher.routing_cache import RoutingCache
from streamkit.publisher.tracing import ProducerTracing, SendContext, traceparent
from streamkit.results import PublishResult
from streamkit.routing import shard_for_key
from streamkit.settings import StreamKitSettings

__all__ = [
    "PAYLOAD_FIELD",
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
    "traceparent",
]

log = logging.getLogger("streamkit.producer")

# Errors after which the command may or may not have been applied: retrying is
# what makes delivery at-least-once instead of at-most-once.
_RETRYABLE: Final = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# The pending entries of a single publish's send: its one entry.
_FIRST: Final = (0,)


class Publisher:
    """Publish messages to the shard streams of ``stream_prefix``.

    ``consumer_group`` names the coordinator group whose producer routing is
    used. Clients passed in are shared and never closed here; clients created
    from ``settings`` are closed by :meth:`aclose`. Nothing connects before the
    first :meth:`start` or publish. ``clock`` (monotonic seconds) drives the
    routing cache; tests inject a controllable one.

    ``maxlen`` trims each shard stream on every write (``MAXLEN ~``): a hard
    cap that drops the oldest entries whether or not every group has read
    them. To bound a stream without losing unread work, give the stream a
    retention instead (``streamkit stream retention``, docs/operations.md).

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
        cache = RoutingCache(
            settings.routing_refresh_interval,
            settings.routing_lease,
            name=f"{stream_prefix}/{consumer_group}",
        )
        self._router = Router(
            cache, self._coordinator, stream_prefix, consumer_group, clock=clock, maxlen=maxlen
        )
        # Concurrent publish() calls share one pipeline (streamkit.publisher.coalescer);
        # off, each call is its own round trip.
        self._coalescer: CommandCoalescer | None = (
            CommandCoalescer(
                functools.partial(send_command, self._redis),
                functools.partial(send_commands, self._redis),
                window=coalesce_window,
                max_batch=self.max_batch,
            )
            if coalesce
            else None
        )
        self._send_one: Callable[..., Awaitable[Any]] = (
            self._coalescer.execute
            if self._coalescer is not None
            else functools.partial(send_command, self._redis)
        )
        self._closed = False
        self._tracing = ProducerTracing(stream_prefix, trace_context_field)
        #: Wrap every publish / publish_many (``streamkit.middleware``).  Kept
        #: as given: an app's publishers share (and see later additions to) its list.
        self.middlewares = middlewares
        self.published = 0
        self.retries = 0

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
            raise PublisherClosedError(f"publisher for {self._router.cache.name} is closed")
        await self._router.start(self._redis)

    async def aclose(self) -> None:
        """Stop the refresh in the air and close the clients created here."""
        if self._closed:
            return
        self._closed = True
        self._router.invalidate()
        await self._router.refresher.aclose()
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
            return await self._publish(partition_key, fields)
        ctx = PublishContext(partition_key, fields, self.stream_prefix, self.consumer_group)
        return await chain(
            self.middlewares,
            "publish",
            ctx,
            lambda: self._publish(ctx.partition_key, ctx.fields),
        )

    async def _publish(self, partition_key: PartitionKey, fields: Fields) -> PublishResult:
        entries = [(partition_key, field_args(fields))]
        results: list[PublishResult | None] = [None]
        if not self._tracing.enabled:
            await self._send(entries, _FIRST, results, {}, True)
        else:
            send = functools.partial(self._send, entries, _FIRST, results, {}, True)
            await self._tracing.send(SendContext(entries, _FIRST, results, single=True), send)
        result = results[0]
        assert result is not None  # _send raises a single publish's error
        return result

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
        entries = [(key, field_args_at(i, fields)) for i, (key, fields) in enumerate(items)]
        results: list[PublishResult | None] = [None] * len(entries)
        errors: dict[int, BaseException] = {}
        for lo in range(0, len(entries), self.max_batch):
            pending = range(lo, min(lo + self.max_batch, len(entries)))
            send = functools.partial(self._send, entries, pending, results, errors, False)
            try:
                if not self._tracing.enabled:
                    await send()
                else:
                    await self._tracing.send(SendContext(entries, pending, results), send)
            except Exception as exc:  # stop at the first batch that cannot be sent
                for i in range(lo, len(entries)):
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
        return await self.publish(partition_key, {field: json_payload(obj)})

    def note_metadata_version(self, version: int) -> None:
        """Report a ``metadataVersion`` seen elsewhere (e.g. a consumer heartbeat).

        If it is newer than the routing in use, the route is stale: the next
        publish refreshes before sending.
        """
        self._router.note_metadata_version(version)

    # -- the send loop ---------------------------------------------------------------

    async def _send(
        self,
        entries: list[tuple[PartitionKey, list[Any]]],
        pending: Sequence[int],
        results: list[PublishResult | None],
        errors: dict[int, BaseException],
        single: bool,
    ) -> int:
        """Send the entries at ``pending`` until each has a result or an error
        (the one loop of ``publish`` and ``publish_many``); the routing version used.

        Connection errors, timeouts and stale routes are retried, up to
        ``max_attempts`` sends. A ``single`` publish raises its error; a batch
        records errors per entry."""
        router = self._router
        version = -1
        attempt = 1
        while pending:
            if self._clock() < router.fast_until:
                snap = router.snap
            else:
                snap = await self._route_slow(entries[pending[0]][0])
            version = snap.version
            seq = router.refresher.started
            count, heads = snap.count, snap.heads
            try:
                if single:  # coalesced with concurrent publishes; errors raise
                    key, args = entries[0]
                    index = shard_for_key(key, count)
                    reply = await self._send_one(*heads[index], *args)
                    if reply is not None:  # appended: the common case, kept short
                        results[0] = PublishResult(
                            snap.keys[index], index, text(reply), snap.version
                        )
                        self.published += 1
                        return version
                    shards, replies = [index], [reply]
                else:
                    shards = [shard_for_key(entries[i][0], count) for i in pending]
                    replies = await send_commands(
                        self._redis,
                        [(*heads[s], *entries[i][1]) for i, s in zip(pending, shards, strict=True)],
                    )
            except _RETRYABLE as exc:
                if attempt >= self.max_attempts or _fatal(exc):
                    raise
                self.retries += len(pending)
                await anyio.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 1.0))
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
                    results[i] = PublishResult(snap.keys[index], index, text(reply), snap.version)
                    self.published += 1
            for index, indexes in stale.items():
                try:
                    # XADD NOMKSTREAM found no stream: returns once routing moved on.
                    await router.stale(snap, index, seq, cooldown=self.stale_route_cooldown)
                    if attempt >= self.max_attempts:
                        raise router.stale_error(snap, index, "routing kept changing")
                except StaleRouteError as exc:
                    for i in indexes:
                        errors[i] = exc
                    continue
                retry.extend(indexes)
            if retry:
                self.retries += len(retry)
            pending = sorted(retry)  # keep input order among the retried
            attempt += 1
        if single and errors:
            raise errors[0]
        return version

    async def _route_slow(self, partition_key: PartitionKey) -> RoutingSnapshot:
        """Everything the hot path skips: start, refresh, lease and shard checks."""
        if self._closed:
            raise PublisherClosedError(f"publisher for {self._router.cache.name} is closed")
        if not self._router.started:
            await self.start()
        self._tracing.recheck()
        return await self._router.route(partition_key)

    # -- observability ---------------------------------------------------------------

    @property
    def tracer(self) -> trace.Tracer:
        """Where spans go; by default ``trace.get_tracer("streamkit")``.

        With the default, a tracer provider installed after the publisher was
        created is noticed within one routing refresh interval.
        """
        return self._tracing.tracer

    @tracer.setter
    def tracer(self, tracer: trace.Tracer) -> None:
        self._tracing.tracer = tracer

    @property
    def trace_context_field(self) -> str | None:
        """Entry field carrying the W3C ``traceparent`` of the producer span
        (consumers link their span to it); None: not written."""
        return self._tracing.trace_context_field

    @trace_context_field.setter
    def trace_context_field(self, field: str | None) -> None:
        self._tracing.trace_context_field = field

    @property
    def coalescer(self) -> CommandCoalescer | None:
        """What turns concurrent ``publish`` calls into pipelines (None when off)."""
        return self._coalescer

    @property
    def routing_cache(self) -> RoutingCache:
        """The cache itself (read it, do not drive it): version, age, failure counters."""
        return self._router.cache

    @property
    def refresher(self) -> RoutingRefresher:
        """Refresh counters: ``started`` (requests), ``refreshes``, ``replacements``."""
        return self._router.refresher

    @property
    def stale_refreshes(self) -> int:
        """Publishes that found a stale route (or a newer version) and refreshed."""
        return self._router.stale_refreshes

    @property
    def routing_failures(self) -> int:
        """Publishes refused for lack of a usable route."""
        return self._router.routing_failures

    @property
    def metadata_version(self) -> int | None:
        table = self._router.cache.table
        return None if table is None else table.metadata_version


def _fatal(exc: BaseException) -> bool:
    # A wrong password is a ConnectionError subclass, but retrying cannot fix it.
    return isinstance(exc, redis.exceptions.AuthenticationError)
