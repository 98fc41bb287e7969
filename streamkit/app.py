"""``StreamKit``: the application object users decorate and ``streamkit run`` serves."""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import ModuleType, TracebackType
from typing import Any, Self, TypeVar

import anyio
from anyio.abc import TaskGroup
from dependency_injector import containers, providers
from opentelemetry import trace
from redis.exceptions import RedisError

from streamkit.connections import AsyncRedis, connect_redis, redacted_url
from streamkit.consumer.failure import FailurePolicy
from streamkit.consumer.lifecycle import ShardLifecycle
from streamkit.consumer.listener import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BLOCK_MS,
    Listener,
    ListenerConfigError,
    MessageHandler,
)
from streamkit.consumer.member import MemberStateMachine, new_incarnation
from streamkit.consumer.poller import ReadObserver, ShardPoller, supports_xackdel
from streamkit.consumer.runtime import GroupNotFoundError, MemberRuntime
from streamkit.consumer.stats import ReadTimer, debug_tracer
from streamkit.coordinator_client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from streamkit.errors import StreamkitError, first_leaf
from streamkit.group_hints import existing_groups_hint
from streamkit.middleware import Middleware
from streamkit.publisher.publisher import (
    CoordinatorUnreachableError,
    Publisher,
    ShardStreamsMissing,
)
from streamkit.redis_health import describe_error
from streamkit.settings import StreamKitSettings

__all__ = ["Lifespan", "RedisUnreachableError", "StreamKit"]

log = logging.getLogger("streamkit.app")

#: How long the start-up PING may take before Redis counts as unreachable.
_REDIS_CHECK_S = 5.0

F = TypeVar("F", bound=Callable[..., Any])
Hook = Callable[[], Awaitable[None] | None]
#: ``lifespan=``: called with the app, entered before listeners start, exited after.
Lifespan = Callable[["StreamKit"], AbstractAsyncContextManager[object]]


class StreamKit:
    """Listeners, publishers, a DI container and the clients they share.

    Settings come from ``STREAMKIT_*`` variables (or ``.env``); keyword
    arguments override single settings: ``StreamKit(redis_url="redis://...")``.
    Clients are created on first use and closed by ``close()``; clients passed
    in are shared and left open.
    """

    def __init__(
        self,
        settings: StreamKitSettings | None = None,
        *,
        container: containers.Container | None = None,
        lifespan: Lifespan | None = None,
        coordinator: CoordinatorClient | None = None,
        redis: AsyncRedis | None = None,
        wire: Iterable[ModuleType | str] = (),
        shutdown_timeout: float = 30.0,
        read_observer: ReadObserver | None = None,
        middlewares: Iterable[Middleware] = (),
        debug_tracer: trace.Tracer | None = None,
        **overrides: Any,
    ) -> None:
        if overrides:
            base = settings.model_dump() if settings is not None else {}
            settings = StreamKitSettings(**{**base, **overrides})
        self.settings = settings or StreamKitSettings()
        self.container: containers.Container = container or containers.DynamicContainer()
        self.shutdown_timeout = shutdown_timeout
        self.read_observer = read_observer
        #: Wrap every handled entry and every publish of this app's publishers
        #: (first = outermost); see ``streamkit.middleware``.
        self.middlewares: list[Middleware] = list(middlewares)
        #: Where heartbeat and read spans go (None: ``STREAMKIT_TRACE_DEBUG``
        #: decides, with the global tracer provider).
        self.debug_tracer = debug_tracer
        self._lifespan = lifespan
        self._coordinator = coordinator
        self._owns_coordinator = coordinator is None
        self._redis = redis
        self._owns_redis = redis is None
        self._wire = list(wire)
        self._listeners: list[Listener] = []
        self._publishers: list[Publisher] = []
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._stack: AsyncExitStack | None = None
        self._members: list[MemberRuntime] = []
        # Set by each member's task when it returns (index as in _members).
        self._finished: list[anyio.Event] = []
        self._member_tg: TaskGroup | None = None
        self._xackdel = False
        self._stop: anyio.Event | None = None
        self._stop_requested = False
        self._force_requested = False

    # -- declarations ------------------------------------------------------------

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return tuple(self._listeners)

    @property
    def publishers(self) -> tuple[Publisher, ...]:
        """The publishers made by ``publisher(...)``."""
        return tuple(self._publishers)

    @property
    def members(self) -> tuple[MemberRuntime, ...]:
        """The running members (empty outside ``serve()``)."""
        return tuple(self._members)

    @property
    def stopping(self) -> bool:
        """``shutdown()`` was asked for (readiness probes answer 503 from then on)."""
        return self._stop_requested

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
        payload_field: str = "payload",
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
        Returns the handler unchanged.
        """

        def register(handler: F) -> F:
            self._add(
                Listener.create(
                    stream_prefix=stream_prefix,
                    group=group,
                    concurrency=concurrency,
                    handler=handler,
                    lifecycle=lifecycle,
                    batch_size=batch_size,
                    max_in_flight=max_in_flight,
                    block_ms=block_ms,
                    ordered=ordered,
                    auto_ack=auto_ack,
                    claim_pending=claim_pending,
                    batch=batch,
                    failure_policy=failure_policy,
                    payload_field=payload_field,
                )
            )
            return handler

        # Validate now, so a bad declaration fails even before a handler is given.
        Listener.create(
            stream_prefix=stream_prefix,
            group=group,
            concurrency=concurrency,
            handler=_placeholder,
            lifecycle=lifecycle,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            block_ms=block_ms,
            failure_policy=failure_policy,
            payload_field=payload_field,
        )
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
        listener = Listener.create(
            stream_prefix=stream_prefix,
            group=group,
            concurrency=concurrency,
            lifecycle=lifecycle,
            require_handler=False,
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

    def publisher(
        self,
        *,
        stream_prefix: str,
        group: str,
        maxlen: int | None = None,
        provide_as: str | None = None,
    ) -> Publisher:
        """A ``Publisher`` sharing this app's coordinator and Redis clients.

        Nothing connects now; ``start()`` (or ``serve()``) checks its routing.
        With ``provide_as`` the publisher is also registered on the container
        (overriding a provider of that name if the container declares one), so
        handlers can receive it with ``Provide["name"]`` / ``Provide[Container.name]``.
        """
        publisher = Publisher(
            stream_prefix,
            group,
            settings=self.settings,
            coordinator=self.coordinator,
            redis=self.redis,
            maxlen=maxlen,
            middlewares=self.middlewares,
            trace_context_field=self.settings.trace_context_field or None,
        )
        self._publishers.append(publisher)
        if provide_as:
            existing = self.container.providers.get(provide_as)
            if existing is not None:
                existing.override(providers.Object(publisher))
            else:
                setattr(self.container, provide_as, providers.Object(publisher))
        return publisher

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

    # -- shared clients ------------------------------------------------------------

    @property
    def coordinator(self) -> CoordinatorClient:
        if self._coordinator is None:
            self._coordinator = CoordinatorClient.from_settings(self.settings)
        return self._coordinator

    @property
    def redis(self) -> AsyncRedis:
        if self._redis is None:
            settings = self.settings
            self._redis = connect_redis(
                settings.redis_url,
                cluster=settings.redis_cluster,
                connect_timeout=settings.redis_connect_timeout,
                socket_timeout=settings.redis_socket_timeout,
            )
        return self._redis

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Wire the container, enter the lifespan, run startup hooks, check publishers."""
        if self._stack is not None:
            return
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            # Exit order: shutdown hooks, lifespan, publishers, clients; so
            # hooks and the lifespan may still publish.
            stack.push_async_callback(self._close_clients)
            stack.push_async_callback(self._close_publishers)
            self._wire_container(stack)
            if self._lifespan is not None:
                await stack.enter_async_context(self._lifespan(self))
            for hook in self._startup:
                await _call(hook)
            for hook in self._shutdown:
                stack.push_async_callback(_call, hook)
            for publisher in self._publishers:
                await self._start_publisher(publisher)
        except BaseException:
            await stack.__aexit__(*sys.exc_info())
            raise
        self._stack = stack

    async def close(self) -> None:
        """Run shutdown hooks, exit the lifespan and release connections."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        else:
            await self._close_clients()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def shutdown(self, *, force: bool = False) -> None:
        """Ask ``serve()`` to stop: members drain, ack and leave the group.

        ``force`` cancels running handlers instead of waiting for them.
        """
        self._stop_requested = True
        self._force_requested = self._force_requested or force
        if self._stop is not None:
            self._stop.set()
        if force:
            for member in self._members:
                member.force_stop()

    async def serve(self, *, freeze_heap: bool = False) -> None:
        """Run every listener until ``shutdown()`` (or cancellation).

        ``freeze_heap``: once started, collect garbage once and move what is
        alive out of the garbage collector's reach (``gc.freeze()``; what
        ``streamkit run`` does with ``STREAMKIT_GC_FREEZE``, the default). A
        full collection then scans only what the process allocated since, not
        every module and client object, which otherwise pauses every handler
        for tens of milliseconds from time to time. Off here by default: the
        heap belongs to the host process (a web app, a test session).
        """
        self._stop = anyio.Event()
        if self._stop_requested:
            self._stop.set()
        # Before start(): hooks and publishers would otherwise be first to
        # stumble over a Redis that is not there, less clearly.
        if self._listeners:
            await self._check_redis()
        await self.start()
        try:
            await self._check_groups()
            self._xackdel = await self._detect_xackdel()
            self._members = self._build_members(self._xackdel)
            log.info(
                "streamkit serving %d listener(s) with %d member(s)",
                len(self._listeners),
                len(self._members),
            )
            if freeze_heap:
                freeze_startup_heap()
            await _unwrapped(self._supervise(self._members, self._stop))
        finally:
            self._members = []
            with anyio.CancelScope(shield=True):
                await self.close()

    # -- internals ---------------------------------------------------------------------

    async def _supervise(self, members: list[MemberRuntime], stop: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:
            # Lists the app keeps, so streamkit.testing.members can replace an entry.
            finished = self._finished = [anyio.Event() for _ in members]
            self._member_tg = tg
            for member, done in zip(members, finished, strict=True):
                name = f"streamkit-member-{member.member_id}"
                tg.start_soon(_run_member, member, done, name=name)
            await stop.wait()
            log.info("shutting down: draining %d member(s)", len(members))
            for member in members:
                member.request_stop()
                if self._force_requested:
                    # shutdown(force=True) came before these members existed.
                    member.force_stop()
            with anyio.move_on_after(self.shutdown_timeout):
                for done in finished:
                    await done.wait()
                return
            log.warning(
                "members did not drain within %.1fs; cancelling handlers", self.shutdown_timeout
            )
            for member in members:
                member.force_stop()
        self._member_tg = None

    def _build_members(self, xackdel: bool) -> list[MemberRuntime]:
        settings = self.settings
        # One incarnation per start: the coordinator tells this start's members
        # apart from any other process (or earlier start) using the same ids.
        incarnation = new_incarnation()
        base = settings.member_id_prefix(incarnation)
        members: list[MemberRuntime] = []
        for listener in self._listeners:
            if (
                self._owns_redis
                and listener.options.block_ms >= settings.redis_socket_timeout * 1000
            ):
                # Every idle read would time out on the socket instead of
                # returning empty, and be logged as a Redis failure.
                raise ListenerConfigError(
                    f"listener {listener.stream_prefix}/{listener.consumer_group}: block_ms="
                    f"{listener.options.block_ms} must be below STREAMKIT_REDIS_SOCKET_TIMEOUT "
                    f"({settings.redis_socket_timeout:g} s)"
                )
            for member_id in listener.member_ids(base):
                members.append(self._member(listener, member_id, incarnation, xackdel))
        return members

    def _member(
        self, listener: Listener, member_id: str, incarnation: str, xackdel: bool
    ) -> MemberRuntime:
        settings = self.settings
        factory = (
            None
            if listener.handler is None
            else functools.partial(self._make_poller, listener, xackdel)
        )
        return MemberRuntime(
            member_id,
            stream_prefix=listener.stream_prefix,
            consumer_group=listener.consumer_group,
            coordinator=self.coordinator,
            redis=self.redis,
            poller=factory,
            hooks=listener.lifecycle,
            lease_ms=settings.assignment_lease_ms,
            member_name=f"{socket.gethostname()}/{os.getpid()}",
            incarnation=incarnation,
            static=settings.static_membership,
            coordinator_url=settings.coordinator_url,
            request_timeout_s=settings.coordinator_timeout,
            redis_release_after_ms=int(settings.redis_release_after * 1000),
            redis_url=redacted_url(settings.redis_url),
            debug_tracer=self._debug_tracer(),
        )

    def _make_poller(
        self, listener: Listener, xackdel: bool, machine: MemberStateMachine
    ) -> ShardPoller:
        policy = listener.failure_policy or FailurePolicy.from_settings(self.settings)
        return ShardPoller(
            machine,
            self.redis,
            stream_prefix=listener.stream_prefix,
            consumer_group=listener.consumer_group,
            handler=listener.async_handler(),
            batch_handler=listener.batch_handler(),
            options=dataclasses.replace(listener.options, policy=policy),
            xackdel=xackdel,
            observer=ReadTimer(self.read_observer, self._debug_tracer()),
            middlewares=self.middlewares,
        )

    def _debug_tracer(self) -> trace.Tracer | None:
        if self.debug_tracer is not None:
            return self.debug_tracer
        return debug_tracer(self.settings.trace_debug)

    async def _check_redis(self) -> None:
        """Fail at once when Redis does not answer: members that joined now
        would take shards they cannot read away from members that can."""
        settings = self.settings
        try:
            with anyio.fail_after(_REDIS_CHECK_S):
                await self.redis.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            raise RedisUnreachableError(
                f"cannot reach Redis at {redacted_url(settings.redis_url)}"
                + (" (cluster)" if settings.redis_cluster else "")
                + f": {describe_error(exc)}; is redis-server running there? "
                "STREAMKIT_REDIS_URL sets the address"
            ) from None

    async def _check_groups(self) -> None:
        """Fail at once for a group the coordinator does not know."""
        for listener in self._listeners:
            prefix, group = listener.key
            try:
                await self.coordinator.get_group(prefix, group)
            except CoordinatorError as exc:
                if exc.status_code == 404:
                    hint = await existing_groups_hint(self.coordinator, prefix, group)
                    raise GroupNotFoundError(
                        prefix, group, self.settings.coordinator_url, hint
                    ) from None
                if exc.status_code == 401:
                    # Wrong or missing credentials: say so now, not only when a
                    # publish or a heartbeat is refused later.
                    log.warning("%s", exc)
                    continue
                # Without the READ role the first heartbeat does the check
                # (a 404 before the first answer is fatal there too).
                log.debug("cannot look up %s/%s before joining: %s", prefix, group, exc)
            except CoordinatorUnavailable as exc:
                log.warning("%s; members keep retrying", exc)
                return

    async def _detect_xackdel(self) -> bool:
        if not any(listener.handler is not None for listener in self._listeners):
            return False
        try:
            native = await supports_xackdel(self.redis)
        except Exception as exc:  # Redis went away since the check: readers retry anyway
            log.warning(
                "could not ask Redis at %s whether it has XACKDEL (%s); using XACK+XDEL",
                redacted_url(self.settings.redis_url),
                describe_error(exc),
            )
            return False
        log.debug("ack_del uses %s", "XACKDEL" if native else "MULTI XACK+XDEL")
        return native

    async def _start_publisher(self, publisher: Publisher) -> None:
        try:
            await publisher.start()
        except ShardStreamsMissing:
            raise
        except CoordinatorUnreachableError as exc:
            log.warning("%s; it will retry on first publish", exc)

    def _wire_container(self, stack: AsyncExitStack) -> None:
        modules: dict[str, ModuleType | str] = {}
        for item in self._wire:
            modules[item if isinstance(item, str) else item.__name__] = item
        for listener in self._listeners:
            for obj in (listener.handler, listener.lifecycle):
                module = getattr(obj, "__module__", None)
                if module is None and obj is not None:
                    module = type(obj).__module__
                if module and module in sys.modules:
                    modules.setdefault(module, sys.modules[module])
        if not modules:
            return
        container = self.container
        container.wire(modules=list(modules.values()))
        stack.callback(container.unwire)

    async def _close_publishers(self) -> None:
        for publisher in self._publishers:
            await publisher.aclose()

    async def _close_clients(self) -> None:
        if self._owns_coordinator and self._coordinator is not None:
            await self._coordinator.aclose()
            self._coordinator = None
        if self._owns_redis and self._redis is not None:
            await self._redis.aclose()
            self._redis = None


class RedisUnreachableError(StreamkitError):
    """Redis did not answer when the app started serving."""


async def _placeholder(message: object) -> None:  # pragma: no cover - never called
    return None


async def _call(hook: Hook) -> None:
    result = hook()
    if inspect.isawaitable(result):
        await result


async def _run_member(member: MemberRuntime, done: anyio.Event) -> None:
    try:
        await member.run()
    finally:
        done.set()


async def _unwrapped(work: Awaitable[None]) -> None:
    """Surface a streamkit error from inside a task group as itself.

    ``GroupNotFoundError`` is clearer than an ``ExceptionGroup`` holding it.
    """
    try:
        await work
    except BaseExceptionGroup as group:
        leaf = first_leaf(group, StreamkitError)
        if leaf is not None:
            raise leaf from group
        raise


def freeze_startup_heap() -> None:
    """Collect once, then keep every object alive now out of later collections.

    The objects alive once an app started (modules, clients, the container)
    live as long as the process; rescanning them is what makes a full
    collection slow (about 0.3 us per object: 30-60 ms for a typical app).
    The collection first frees start-up garbage, which freezing would keep.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug(
        "froze %d objects out of garbage collection in %.0f ms",
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1000,
    )
