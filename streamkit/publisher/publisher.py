"""Publishing to the shard streams of one logical stream: :class:`Publisher`.

Each message is routed by its partition key (``streamkit.publisher.router``)
and appended with ``XADD key NOMKSTREAM [MAXLEN ~ n] * ...``, so a retired
shard key fails instead of being recreated; ``publish`` and ``publish_many``
share one send loop.  Delivery is at-least-once: a retry after a connection
error may append a second copy (docs/producer.md), unless the publish is
idempotent: then the check and the append are one script on the shard
(``streamkit.publisher.idempotence``) and a retry goes to the shard of the
first attempt.  How the parts fit: docs/architecture.md ("The publisher").
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

from streamkit.closing import AsyncClosing
from streamkit.connections import AsyncRedis, connect_redis, send_command, send_commands
from streamkit.coordinator_client import CoordinatorClient
from streamkit.middleware import Middleware, PublishContext, PublishManyContext, chain
from streamkit.publisher import send_loop
from streamkit.publisher.coalescer import CommandCoalescer
from streamkit.publisher.decorator import publish_result, publishes
from streamkit.publisher.encoding import (
    PAYLOAD_FIELD,
    Fields,
    FieldValue,
    PartitionKey,
    field_args,
    field_args_at,
    json_payload,
)

# The publisher's errors are importable from here too (docs/producer.md): the
# explicit re-export names them once, where they are defined (errors.__all__).
from streamkit.publisher.errors import (
    CoordinatorUnreachableError as CoordinatorUnreachableError,
)
from streamkit.publisher.errors import (
    PublishBatchError as PublishBatchError,
)
from streamkit.publisher.errors import (
    PublisherClosedError as PublisherClosedError,
)
from streamkit.publisher.errors import (
    PublishError as PublishError,
)
from streamkit.publisher.errors import (
    PublisherStartupError as PublisherStartupError,
)
from streamkit.publisher.errors import (
    RoutingUnavailable as RoutingUnavailable,
)
from streamkit.publisher.errors import (
    ShardStreamsMissing as ShardStreamsMissing,
)
from streamkit.publisher.errors import (
    StaleRouteError as StaleRouteError,
)
from streamkit.publisher.errors import (
    UnknownGroupError as UnknownGroupError,
)
from streamkit.publisher.idempotence import (
    IDEMPOTENCY_FIELD,
    PublishIdempotence,
    send_merged,
    supports_idmp,
)
from streamkit.publisher.refresher import RoutingSource
from streamkit.publisher.router import Router, RoutingSnapshot
from streamkit.publisher.routing_cache import RoutingCache
from streamkit.publisher.send_loop import Ids
from streamkit.publisher.tracing import ProducerTracing, SendContext, traceparent
from streamkit.publisher.views import PublisherViews
from streamkit.results import PublishResult
from streamkit.settings import StreamKitSettings

__all__ = [
    "PAYLOAD_FIELD",
    "FieldValue",
    "Fields",
    "PartitionKey",
    "PublishIdempotence",
    "PublishResult",
    "Publisher",
    "publish_result",
    "traceparent",
]

log = logging.getLogger("streamkit.producer")

# The pending entries of a single publish's send: its one entry.
_FIRST: Final = (0,)


class Publisher(AsyncClosing, PublisherViews):
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
        key: Callable[[Any], PartitionKey] | None = None,
        field: str = PAYLOAD_FIELD,
        as_fields: bool = False,
        idempotent: bool | PublishIdempotence = False,
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
        source = RoutingSource(cache, self._coordinator, stream_prefix, consumer_group, clock)
        self._router = Router(source, maxlen=maxlen)
        # Concurrent publish() calls share one pipeline (streamkit.publisher.coalescer);
        # off, each call is its own round trip.
        self._coalescer: CommandCoalescer | None = (
            CommandCoalescer(
                functools.partial(send_command, self._redis),
                # Concurrent idempotent publishes: one batched script per shard.
                functools.partial(send_merged, functools.partial(send_commands, self._redis)),
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
        #: ``@publisher`` (``__call__``): how a returned item is keyed and written.
        self.key, self.field, self.as_fields = key, field, as_fields
        #: The functions ``@publisher`` decorated (original, wrapper), in order.
        self.decorated: list[tuple[Callable[..., Any], Callable[..., Any]]] = []
        #: Told of each decoration (an app rebinds a listener registered before it).
        self.on_decorate: Callable[[Callable[..., Any], Callable[..., Any]], None] | None = None

        #: Idempotent publishing (``idempotent=``): every publish carries an
        #: id; None: only publishes given an ``idempotency_id`` do.
        self.idempotence: PublishIdempotence | None = (
            idempotent
            if isinstance(idempotent, PublishIdempotence)
            else PublishIdempotence()
            if idempotent
            else None
        )
        # Used for caller-given ids when the publisher itself is not idempotent.
        self._idem = self.idempotence or PublishIdempotence()
        self._idmp_checked = False
        #: Idempotent publishes answered from the dedup record (a retry, or a
        #: caller's id published again): nothing appended.
        self.deduplicated = 0

    def __call__(self, function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """``@publisher``: publish what ``function`` returns (``streamkit.publisher.decorator``)."""
        if self.key is None:
            raise TypeError(
                f"publisher {self._router.cache.name} has no key: give key=lambda item: ... "
                "to app.publisher(...) (or Publisher(...)) to use it as a decorator"
            )
        wrapper = publishes(self, self.key, field=self.field, as_fields=self.as_fields)(function)
        self.decorated.append((function, wrapper))
        if self.on_decorate is not None:
            self.on_decorate(function, wrapper)
        return wrapper

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
        if not self._idmp_checked:
            self._idmp_checked = True
            idem = self._idem
            # XADD IDMP (Redis 8.6+) only where the server's default window
            # covers ours: a XCFGSET to widen it would clear every producer's ids.
            idem.native = idem.native_fits() and await supports_idmp(self._redis)

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

    # -- publishing ------------------------------------------------------------------

    async def publish(
        self,
        partition_key: PartitionKey,
        fields: Fields,
        *,
        idempotency_id: str | None = None,
    ) -> PublishResult:
        """Append one message to the shard of ``partition_key`` (at-least-once).

        With ``idempotency_id`` (or a publisher made with ``idempotent=True``,
        which draws one) the publish is idempotent: a retry after a lost reply,
        or the same id published again within the window, returns the first
        entry's id (``result.deduplicated``) instead of appending a copy.

        ``fields`` is a mapping of field names to values, or a pydantic model,
        which is written as JSON in the ``payload`` field (as ``publish_json``).

        Raises ``TypeError`` for field values that are not str, bytes, int or
        float, :class:`RoutingUnavailable` when no trusted routing exists (fail
        closed), :class:`StaleRouteError` when the routed shard stream is gone
        and fresh routing still points to it, and the redis-py error after
        ``max_attempts`` connection failures.
        """
        if not self.middlewares:
            return await self._publish(partition_key, fields, idempotency_id)
        ctx = PublishContext(partition_key, fields, self.stream_prefix, self.consumer_group)
        return await chain(
            self.middlewares,
            "publish",
            ctx,
            lambda: self._publish(ctx.partition_key, ctx.fields, idempotency_id),
        )

    async def _publish(
        self, partition_key: PartitionKey, fields: Fields, idempotency_id: str | None = None
    ) -> PublishResult:
        args = field_args(fields)
        ids: Ids | None = None
        if idempotency_id is not None or self.idempotence is not None:
            idem = self._id_of(idempotency_id)
            ids = [idem]
            args = [IDEMPOTENCY_FIELD, idem[0], *args]
        entries = [(partition_key, args)]
        results: list[PublishResult | None] = [None]
        if not self._tracing.enabled:
            await self._send(entries, _FIRST, results, {}, True, ids)
        else:
            send = functools.partial(self._send, entries, _FIRST, results, {}, True, ids)
            await self._tracing.send(SendContext(entries, _FIRST, results, single=True), send)
        result = results[0]
        assert result is not None  # _send raises a single publish's error
        return result

    async def publish_many(
        self,
        items: Iterable[tuple[PartitionKey, Fields]],
        *,
        idempotency_ids: Sequence[str] | None = None,
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
        raises the error itself.  ``idempotency_ids`` (one per message) makes
        every message an idempotent publish, as ``publish(idempotency_id=...)``.
        """
        if not self.middlewares:
            return await self._publish_many(items, idempotency_ids)
        ctx = PublishManyContext(list(items), self.stream_prefix, self.consumer_group)
        return await chain(
            self.middlewares,
            "publish_many",
            ctx,
            lambda: self._publish_many(ctx.items, idempotency_ids),
        )

    async def _publish_many(
        self,
        items: Iterable[tuple[PartitionKey, Fields]],
        idempotency_ids: Sequence[str] | None = None,
    ) -> list[PublishResult]:
        entries = [(key, field_args_at(i, fields)) for i, (key, fields) in enumerate(items)]
        ids: Ids | None = None
        if idempotency_ids is not None and len(idempotency_ids) != len(entries):
            raise ValueError(
                f"idempotency_ids: {len(idempotency_ids)} ids for {len(entries)} messages"
            )
        if self.idempotence is not None or idempotency_ids is not None:
            given: Sequence[str | None] = idempotency_ids or [None] * len(entries)
            drawn = [self._id_of(idem) for idem in given]
            entries = [
                (key, [IDEMPOTENCY_FIELD, idem[0], *args])
                for (key, args), idem in zip(entries, drawn, strict=True)
            ]
            ids = list(drawn)
        results: list[PublishResult | None] = [None] * len(entries)
        errors: dict[int, BaseException] = {}
        for lo in range(0, len(entries), self.max_batch):
            pending = range(lo, min(lo + self.max_batch, len(entries)))
            send = functools.partial(self._send, entries, pending, results, errors, False, ids)
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

    def _id_of(self, idempotency_id: str | None) -> tuple[str, bool]:
        if idempotency_id is None:
            return self._idem.next_id(), True
        if not isinstance(idempotency_id, str) or not idempotency_id:
            raise ValueError(f"idempotency_id must be a non-empty str, got {idempotency_id!r}")
        return idempotency_id, False

    def note_metadata_version(self, version: int) -> None:
        """Report a ``metadataVersion`` seen elsewhere (e.g. a consumer heartbeat).

        If it is newer than the routing in use, the route is stale: the next
        publish refreshes before sending.
        """
        self._router.note_metadata_version(version)

    # -- the send loop ---------------------------------------------------------------

    _send = send_loop.send

    async def _route_slow(self, partition_key: PartitionKey) -> RoutingSnapshot:
        """Everything the hot path skips: start, refresh, lease and shard checks."""
        if self._closed:
            raise PublisherClosedError(f"publisher for {self._router.cache.name} is closed")
        if not self._router.started:
            await self.start()
        self._tracing.recheck()
        return await self._router.route(partition_key)
