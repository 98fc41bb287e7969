"""What an app declares: listeners, publishers, hooks and the streams it needs.

``StreamKit`` inherits these methods; nothing here connects to anything.  A
declared stream (``app.stream("orders", shards=8)``, or ``shards=8`` on a
listener) is what ``app.start()`` provisions through the coordinator, the way
Spring Kafka creates its ``NewTopic`` beans at start-up; see
``streamkit.provisioning``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from dependency_injector import containers, providers

from streamkit.consumer.failure import FailurePolicy
from streamkit.consumer.idempotence import Idempotence
from streamkit.consumer.lifecycle import ShardLifecycle
from streamkit.consumer.listener import (
    Listener,
    ListenerConfigError,
    MessageHandler,
    _check_name,
)
from streamkit.consumer.options import DEFAULT_BATCH_SIZE, DEFAULT_BLOCK_MS
from streamkit.middleware import Middleware
from streamkit.publisher.encoding import PAYLOAD_FIELD, PartitionKey
from streamkit.publisher.publisher import Publisher

if TYPE_CHECKING:
    from streamkit.connections import AsyncRedis
    from streamkit.coordinator_client import CoordinatorClient
    from streamkit.settings import StreamKitSettings

__all__ = ["AppDeclarations", "Hook", "StreamDeclaration"]

F = TypeVar("F", bound=Callable[..., Any])
Hook = Callable[[], Awaitable[None] | None]
#: The coordinator's bound on a stream's shard count (``MAX_SHARD_COUNT``).
_MAX_SHARDS = 4096


@dataclass(frozen=True, slots=True)
class StreamDeclaration:
    """A stream the app needs, with its shard count and the groups to create on it.

    ``shards=None``: whatever the coordinator's default is, never compared.
    """

    stream_prefix: str
    shards: int | None
    groups: tuple[str, ...] = ()


def _check_shards(stream_prefix: str, shards: object) -> int | None:
    if shards is None:
        return None
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= _MAX_SHARDS:
        raise ListenerConfigError(
            f"stream {stream_prefix!r}: shards must be an integer from 1 to {_MAX_SHARDS}, "
            f"got {shards!r}"
        )
    return shards


class AppDeclarations:
    """The declaring half of ``StreamKit``: everything decided before ``start()``."""

    # Provided by StreamKit.
    settings: StreamKitSettings
    container: containers.Container
    middlewares: list[Middleware]

    @property
    def coordinator(self) -> CoordinatorClient:
        raise NotImplementedError

    @property
    def redis(self) -> AsyncRedis:
        raise NotImplementedError

    def _init_declarations(self) -> None:
        self._listeners: list[Listener] = []
        self._publishers: list[Publisher] = []
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        # stream prefix -> (shards, extra groups), in declaration order.
        self._streams: dict[str, tuple[int | None, tuple[str, ...]]] = {}

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return tuple(self._listeners)

    @property
    def publishers(self) -> tuple[Publisher, ...]:
        """The publishers made by ``publisher(...)``."""
        return tuple(self._publishers)

    # -- streams -------------------------------------------------------------------

    def stream(
        self, stream_prefix: str, *, shards: int | None = None, groups: Iterable[str] = ()
    ) -> StreamDeclaration:
        """Declare a stream the app needs: ``start()`` creates it when it is missing.

        It gets ``shards`` shards (None: the coordinator's default), and the
        groups named here as well as every group this app's listeners and
        publishers use on it are created with it.  An existing stream is
        never resharded implicitly: a different shard count is logged, with
        the command that changes it.  Creating needs the ``WRITE`` role.
        """
        prefix = _check_name("stream_prefix", stream_prefix)
        count = _check_shards(prefix, shards)
        extra = tuple(_check_name("group", group) for group in groups)
        known_shards, known_groups = self._streams.get(prefix, (None, ()))
        if known_shards is not None and count is not None and known_shards != count:
            raise ListenerConfigError(
                f"stream {prefix!r} is declared with {known_shards} shards and with {count}; "
                "declare one shard count"
            )
        merged = tuple(dict.fromkeys((*known_groups, *extra)))
        self._streams[prefix] = (known_shards if count is None else count, merged)
        return self._declaration(prefix)

    def declared_streams(self) -> tuple[StreamDeclaration, ...]:
        """The declared streams, each with every group the app uses on it."""
        return tuple(self._declaration(prefix) for prefix in self._streams)

    def _declaration(self, prefix: str) -> StreamDeclaration:
        shards, extra = self._streams[prefix]
        used = [x.consumer_group for x in self._listeners if x.stream_prefix == prefix]
        used += [p.consumer_group for p in self._publishers if p.stream_prefix == prefix]
        return StreamDeclaration(prefix, shards, tuple(dict.fromkeys((*used, *extra))))

    # -- listeners -----------------------------------------------------------------

    def stream_listener(
        self,
        *,
        stream_prefix: str,
        group: str,
        concurrency: int = 1,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_in_flight: int | None = None,
        block_ms: int = DEFAULT_BLOCK_MS,
        auto_ack: bool | None = None,
        ordered: bool = True,
        claim_pending: bool = True,
        lifecycle: ShardLifecycle | None = None,
        batch: bool | None = None,
        failure_policy: FailurePolicy | None = None,
        payload_field: str = PAYLOAD_FIELD,
        shards: int | None = None,
        idempotent: bool | Idempotence = False,
    ) -> Callable[[F], F]:
        """Register ``handler(msg)`` for every entry of the group's shards.

        ``concurrency`` members (``{member_id_base}-{start}-m{i}``) share the shards;
        each reads up to ``batch_size`` entries per ``XREADGROUP`` and holds at
        most ``max_in_flight`` (default ``4 * batch_size``) unfinished entries.
        ``ordered`` handles a shard's entries one at a time in stream order;
        ``auto_ack`` acks after the handler returns (default: only for handlers
        that do not receive their messages, and batch handlers);
        ``lifecycle`` adds shard hooks next to the built-in poller.  A handler
        typed ``(order: Order)`` gets the JSON ``payload_field`` decoded into
        the pydantic model; ``batch`` (or a ``list[...]`` annotation) hands it
        up to ``batch_size`` entries at a time.  ``failure_policy`` (default:
        from the settings) says how failures are retried and dead-lettered.
        ``shards`` declares the stream (``app.stream(stream_prefix,
        shards=...)``), so ``start()`` creates it and the group when missing.
        ``idempotent`` (True, or an ``Idempotence`` for its windows) skips
        entries whose id was handled already and commits ``msg.effects``
        exactly once with the ack (docs/consumer.md, "Idempotency").
        Returns the handler unchanged.
        """
        declare = functools.partial(
            Listener.create,
            stream_prefix=stream_prefix,
            group=group,
            concurrency=concurrency,
            lifecycle=lifecycle,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            block_ms=block_ms,
            ordered=ordered,
            claim_pending=claim_pending,
            failure_policy=failure_policy,
            payload_field=payload_field,
            idempotent=idempotent,
        )
        # Validate now, so a bad declaration fails even before a handler is
        # given; batch and auto_ack are checked against the handler itself.
        declare(handler=_placeholder, batch=None, auto_ack=None)
        if shards is not None:
            self.stream(stream_prefix, shards=shards)

        def register(handler: F) -> F:
            listener = declare(handler=handler, batch=batch, auto_ack=auto_ack)
            self._add(listener)
            return handler

        return register

    def shard_listener(
        self,
        *,
        stream_prefix: str,
        group: str,
        lifecycle: ShardLifecycle,
        concurrency: int = 1,
    ) -> Listener:
        """Members without the built-in poller: ``lifecycle`` does the reading.

        The hooks get a ``ShardContext`` (member id, epoch, Redis client,
        stream keys, ``may_read``); see ``ShardLifecycle`` for the rules.
        """
        listener = Listener.for_lifecycle(
            stream_prefix=stream_prefix, group=group, lifecycle=lifecycle, concurrency=concurrency
        )
        self._add(listener)
        return listener

    def add_listener(
        self, stream_prefix: str, group: str, handler: MessageHandler, **options: Any
    ) -> Listener:
        """``stream_listener`` without decorator syntax."""
        self.stream_listener(stream_prefix=stream_prefix, group=group, **options)(handler)
        return self._listeners[-1]

    def _add(self, listener: Listener) -> None:
        for existing in self._listeners:
            if existing.key == listener.key:
                # Member ids are per group: two listeners on one group in one
                # process would claim the same member ids.
                raise ListenerConfigError(
                    f"a listener for stream {listener.stream_prefix!r} group "
                    f"{listener.consumer_group!r} is already registered ({existing.name}); "
                    "use one listener with a higher concurrency"
                )
        self._listeners.append(listener)

    # -- publishers, middleware, hooks ---------------------------------------------

    def publisher(
        self,
        stream_prefix: str,
        *,
        group: str,
        key: Callable[[Any], PartitionKey] | None = None,
        field: str = PAYLOAD_FIELD,
        as_fields: bool = False,
        maxlen: int | None = None,
        provide_as: str | None = None,
    ) -> Publisher:
        """A ``Publisher`` sharing this app's coordinator and Redis clients.

        With ``key`` it is also a decorator: ``@app.publisher("invoices",
        group="billing", key=lambda inv: inv.customer_id)`` on a listener (above
        or below ``@app.stream_listener``) or on any async function publishes
        what the function returns (a model, a dict, a list of them; ``None``
        for nothing) under ``key(item)``, before the listener acks the entry.
        The return annotation is the published payload's schema.  Nothing
        connects now; ``start()`` (or ``serve()``) checks its routing.  With
        ``provide_as`` the publisher is also registered on the container
        (overriding a provider of that name if the container declares one), so
        handlers can receive it with ``Provide["name"]`` / ``Provide[Container.name]``.
        """
        if key is not None and not callable(key):
            raise ListenerConfigError(f"key must be a function of the published item, got {key!r}")
        publisher = Publisher(
            _check_name("stream_prefix", stream_prefix),
            _check_name("group", group),
            settings=self.settings,
            coordinator=self.coordinator,
            redis=self.redis,
            maxlen=maxlen,
            middlewares=self.middlewares,
            trace_context_field=self.settings.trace_context_field or None,
            key=key,
            field=field,
            as_fields=as_fields,
        )
        publisher.on_decorate = self._rebind
        self._publishers.append(publisher)
        if provide_as:
            existing = self.container.providers.get(provide_as)
            if existing is not None:
                existing.override(providers.Object(publisher))
            else:
                setattr(self.container, provide_as, providers.Object(publisher))
        return publisher

    def _rebind(self, function: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
        """``@publisher`` above ``@stream_listener``: the listener calls the wrapper."""
        for index, listener in enumerate(self._listeners):
            if listener.handler is function:
                listener.check_publishes()
                self._listeners[index] = dataclasses.replace(listener, handler=wrapper)

    def add_middleware(self, middleware: Middleware) -> None:
        """Append ``middleware`` (innermost so far) to every listener and publisher."""
        self.middlewares.append(middleware)

    def on_startup(self, hook: F) -> F:
        """Run ``hook()`` (sync or async) before listeners start."""
        self._startup.append(hook)
        return hook

    def on_shutdown(self, hook: F) -> F:
        """Run ``hook()`` (sync or async) after listeners stopped, in reverse order."""
        self._shutdown.append(hook)
        return hook


async def _placeholder(message: object) -> None:  # pragma: no cover - never called
    return None
