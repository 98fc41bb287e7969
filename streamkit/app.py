"""``StreamKit``: the application object users decorate and ``streamkit run`` serves."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup
from dependency_injector import containers

from streamkit.closing import AsyncClosing
from streamkit.connections import AsyncRedis, connect_redis, redacted_url
from streamkit.consumer.failure import FailurePolicy
from streamkit.consumer.listener import Listener, ListenerConfigError
from streamkit.consumer.member import MemberStateMachine, new_incarnation
from streamkit.consumer.poller import ReadObserver, ShardPoller
from streamkit.consumer.runtime import MemberRuntime
from streamkit.consumer.stats import ReadTimer, debug_tracer
from streamkit.coordinator_client import CoordinatorClient
from streamkit.declarations import AppDeclarations, Hook, StreamDeclaration
from streamkit.errors import StreamkitError, first_leaf
from streamkit.middleware import Middleware
from streamkit.publisher.publisher import (
    CoordinatorUnreachableError,
    Publisher,
    ShardStreamsMissing,
)
from streamkit.settings import StreamKitSettings
from streamkit.startup import (
    RedisUnreachableError,
    check_groups,
    check_redis,
    detect_xackdel,
    freeze_startup_heap,
)

if TYPE_CHECKING:
    from opentelemetry import trace

__all__ = ["Lifespan", "RedisUnreachableError", "StreamDeclaration", "StreamKit"]

log = logging.getLogger("streamkit.app")

#: ``lifespan=``: called with the app, entered before listeners start, exited after.
Lifespan = Callable[["StreamKit"], AbstractAsyncContextManager[object]]


class StreamKit(AsyncClosing, AppDeclarations):
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
        self._init_declarations()
        self._stack: AsyncExitStack | None = None
        self._members: list[MemberRuntime] = []
        # Set by each member's task when it returns (index as in _members).
        self._finished: list[anyio.Event] = []
        self._member_tg: TaskGroup | None = None
        self._xackdel = False
        self._stop: anyio.Event | None = None
        self._stop_requested = False
        self._force_requested = False

    @property
    def members(self) -> tuple[MemberRuntime, ...]:
        """The running members (empty outside ``serve()``)."""
        return tuple(self._members)

    @property
    def stopping(self) -> bool:
        """``shutdown()`` was asked for (readiness probes answer 503 from then on)."""
        return self._stop_requested

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
        """Create the declared streams that are missing, wire the container,
        enter the lifespan, run startup hooks, check publishers."""
        if self._stack is not None:
            return
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            # Exit order: shutdown hooks, lifespan, publishers, clients; so
            # hooks and the lifespan may still publish.
            stack.push_async_callback(self._close_clients)
            stack.push_async_callback(self._close_publishers)
            await self.provision()
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

    async def provision(self) -> None:
        """Create the declared streams and groups that do not exist yet (``stream()``).

        ``start()`` does it first; it needs the ``WRITE`` role only when
        something is missing.
        """
        declared = self.declared_streams()
        if not declared:
            return
        # Imported here: an app without declarations never needs it.
        from streamkit.admin import requested_by
        from streamkit.provisioning import provision

        username = self.settings.coordinator_username
        await provision(
            self.coordinator, declared, requested_by=requested_by(username), username=username
        )

    async def close(self) -> None:
        """Run shutdown hooks, exit the lifespan and release connections."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        else:
            await self._close_clients()

    #: The name the publisher, the coordinator client and ``contextlib.aclosing`` use.
    aclose = close

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
            await check_redis(self.redis, self.settings)
        await self.start()
        try:
            await check_groups(
                self.coordinator,
                self._listeners,
                self.settings.coordinator_url,
                credentials=bool(
                    self.settings.coordinator_username or self.settings.coordinator_token
                ),
            )
            if any(listener.handler is not None for listener in self._listeners):
                self._xackdel = await detect_xackdel(self.redis, self.settings)
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
