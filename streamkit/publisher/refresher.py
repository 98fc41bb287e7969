"""The I/O loop around :class:`~streamkit.publisher.routing_cache.RoutingCache`.

A :class:`RoutingRefresher` fetches producer routing from the coordinator and
feeds the answers (or failures) to the cache. Refreshes are *single-flight*: at
most one request per cache is in the air, and every caller that needs fresh
routing waits for that one instead of sending its own (no thundering herd when
a thousand publishes notice the same stale route).

Each refresh runs in its own short-lived task, not in the caller's task:

* a caller that only wants a refresh *scheduled* (the lease is still good)
  does not wait for the coordinator at all;
* a caller that is cancelled while waiting (its own timeout) does not cancel
  the request the other waiters share.

There is no long-lived background loop: a refresh is started by the publish
path when the cache says one is due, so an idle or forgotten publisher costs
nothing and leaks nothing. ``aclose()`` cancels a refresh still in the air.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import httpx

from streamkit.coordinator_client import CoordinatorClient, CoordinatorUnavailable
from streamkit.errors import StreamkitError
from streamkit.protocol import ProducerRoutingResponse
from streamkit.publisher.routing_cache import RoutingCache, RoutingTable

__all__ = ["RefreshFlight", "RefresherClosed", "RoutingRefresher", "RoutingSource"]

log = logging.getLogger("streamkit.producer")

# What a request on a connection the server has just closed fails with.
_CLOSED_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class RefresherClosed(StreamkitError):
    """The refresher was closed while (or before) a refresh could run."""


class RefreshFlight:
    """One routing request to the coordinator and its outcome."""

    __slots__ = ("done", "error", "ignored_older", "number", "replaced", "task")

    def __init__(self, number: int) -> None:
        self.number = number  # 1, 2, 3 ... in start order
        self.done = anyio.Event()
        self.error: BaseException | None = None  # None once done: the answer was applied
        self.replaced = False  # a newer table replaced the cached one
        self.ignored_older = False  # the coordinator answered an older version
        self.task: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True, repr=False)
class RoutingSource:
    """Where one publisher's routing comes from, shared by its router and refresher."""

    cache: RoutingCache
    coordinator: CoordinatorClient
    stream_prefix: str
    consumer_group: str
    clock: Callable[[], float]

    @property
    def name(self) -> str:
        return f"{self.stream_prefix}/{self.consumer_group}"

    async def fetch(self) -> ProducerRoutingResponse:
        return await self.coordinator.get_routing(self.stream_prefix, self.consumer_group)


class RoutingRefresher:
    """Fetches routing for one ``(stream_prefix, consumer_group)`` into a cache."""

    def __init__(
        self,
        source: RoutingSource,
        *,
        on_finished: Callable[[RefreshFlight], None] | None = None,
    ) -> None:
        self.source = source
        self.cache = source.cache
        self._on_finished = on_finished
        self._flight: RefreshFlight | None = None
        self._last: RefreshFlight | None = None
        self._started = 0
        self._closed = False
        #: Answers applied (any version) and answers that replaced the table.
        self.refreshes = 0
        self.replacements = 0

    @property
    def started(self) -> int:
        """Number of refreshes started so far.

        Read it before sending a command; after a stale-route reply, pass it as
        ``refresh(newer_than=...)`` to wait only for a refresh that was sent
        after the command, which is guaranteed to see the change that made the
        route stale.
        """
        return self._started

    @property
    def in_flight(self) -> bool:
        return self._flight is not None

    def schedule(self) -> RefreshFlight:
        """Make sure a refresh is running; do not wait for it."""
        return self._flight or self._start()

    async def refresh(self, *, newer_than: int | None = None) -> RefreshFlight:
        """Wait for a refresh and return it (check ``.error`` for its outcome).

        With ``newer_than=None`` join the refresh in the air, or start one.
        Otherwise wait for one numbered above ``newer_than``: an older request
        may have been answered before the change the caller just observed.
        """
        while True:
            flight = self._flight
            if flight is not None and (newer_than is None or flight.number > newer_than):
                await flight.done.wait()
                return flight
            last = self._last
            if newer_than is not None and last is not None and last.number > newer_than:
                return last  # a fresh enough answer has already landed
            if flight is None:
                flight = self._start()
                await flight.done.wait()
                return flight
            await flight.done.wait()  # too old for us: let it land, then start ours

    async def aclose(self) -> None:
        """Cancel a refresh in the air and refuse new ones."""
        self._closed = True
        flight = self._flight
        if flight is not None and flight.task is not None:
            flight.task.cancel()
            # Shielded: aclose must not return (or be cancelled) with the task
            # still running, or it would outlive the clients it uses.
            with anyio.CancelScope(shield=True):
                await flight.done.wait()

    # -- internals ---------------------------------------------------------------

    def _start(self) -> RefreshFlight:
        if self._closed:
            raise RefresherClosed(f"routing refresher for {self.source.name} is closed")
        self._started += 1
        flight = RefreshFlight(self._started)
        self._flight = flight
        # A plain asyncio task, not an anyio task group: the first publish may
        # happen in any task of the application and a task group would have to
        # be exited by that same task. redis.asyncio already ties us to asyncio.
        # We keep the reference (asyncio only keeps weak ones) until it is done.
        flight.task = asyncio.get_running_loop().create_task(
            self._run(flight), name=f"streamkit routing refresh {self.source.name}"
        )
        return flight

    async def _run(self, flight: RefreshFlight) -> None:
        cache = self.cache
        # The lease runs from when the request was *sent*: the answer was true
        # at some point after that, never before.
        sent_at = self.source.clock()
        try:
            answer = await self._fetch()
            table = RoutingTable.from_wire(answer.to_wire(), sent_at)
        except Exception as exc:  # any failure keeps the cache; its lease decides
            flight.error = exc
            cache.refresh_failed(self.source.clock(), exc)
            log.warning(
                "producer routing refresh for %s failed (%d in a row): %s",
                self.source.name,
                cache.consecutive_failures,
                exc,
            )
        except BaseException:
            flight.error = RefresherClosed("routing refresh cancelled")
            raise
        else:
            older = cache.older_responses
            flight.replaced = cache.apply(table, self.source.clock())
            flight.ignored_older = cache.older_responses > older
            self.refreshes += 1
            self.replacements += flight.replaced
            if flight.ignored_older:
                # Redis under the coordinator lost writes (or was restored):
                # never go back, and say so loudly: an operator should alert on it
                # (``routing_cache.older_responses``).
                log.warning(
                    "coordinator answered producer routing version %d for %s, older "
                    "than the version %d in use (highest seen %d); ignored",
                    table.metadata_version,
                    self.source.name,
                    cache.table.metadata_version if cache.table else -1,
                    cache.highest_seen_version,
                )
        finally:
            self._flight = None
            self._last = flight
            flight.done.set()
            if self._on_finished is not None:
                self._on_finished(flight)

    async def _fetch(self) -> ProducerRoutingResponse:
        try:
            return await self.source.fetch()
        except CoordinatorUnavailable as exc:
            # The coordinator (uvicorn) closes keep-alive connections idle for
            # 5 s, about our refresh interval: a request can race that close on
            # a pooled connection. Those errors are immediate (not timeouts) and
            # the GET is idempotent, so one retry on a fresh connection is safe.
            if not isinstance(exc.__cause__, _CLOSED_CONNECTION):
                raise
            return await self.source.fetch()
