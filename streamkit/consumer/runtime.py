"""The member runtime: one coordinator member's heartbeat loop and its reactions.

``MemberStateMachine`` (``streamkit.consumer.member``) makes every protocol decision;
this module only does the I/O around it:

* heartbeat every ``heartbeatIntervalMs`` (from the last answer), calling
  ``next_request`` right before sending so the lease is counted from the send;
* turn the machine's reactions into calls on the reader (the built-in
  ``ShardPoller``) and the user's ``ShardLifecycle`` hooks, running them as
  tasks so a slow hook never delays a heartbeat; operations on one shard run
  strictly one after another (assign, then revoke, then assign again);
* report ``REVOKED`` promptly: a finished drain wakes the heartbeat loop;
* retry with jittered exponential backoff while the coordinator is down, but
  never less often than once per interval while the lease is still valid;
* on shutdown: stop reading, drain, then leave with epoch -1, so the
  coordinator can hand the shards over at once instead of waiting for a lease.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from redis.exceptions import RedisError

from streamkit.backoff import jittered_backoff
from streamkit.connections import AsyncRedis
from streamkit.consumer.lifecycle import ShardContext, ShardLifecycle, monotonic_ms
from streamkit.consumer.member import MemberStateMachine, Reaction, ReactionKind
from streamkit.consumer.poller import ShardPoller
from streamkit.consumer.stats import Timing, end_span
from streamkit.coordinator_client import (
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnavailable,
)
from streamkit.errors import StreamkitError
from streamkit.protocol import HeartbeatAnswer, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus
from streamkit.redis_health import describe_error

__all__ = [
    "MEMBER_ID_IN_USE",
    "AssignmentLeaseError",
    "GroupNotFoundError",
    "MemberRejectedError",
    "MemberRuntime",
]

log = logging.getLogger("streamkit.consumer")

_RETRY_BASE_MS = 100
_RETRY_CAP_MS = 5_000
_LEAVE_ATTEMPTS = 3
#: The coordinator's answer to a join for a member id another process holds.
MEMBER_ID_IN_USE = "MEMBER_ID_IN_USE"
#: How long a member whose Redis is unreachable waits for in-flight handlers
#: before it leaves anyway (their acks could not be sent in any case).
_RELEASE_DRAIN_S = 2.0

PollerFactory = Callable[[MemberStateMachine], ShardPoller]


class GroupNotFoundError(StreamkitError):
    """The coordinator does not know the stream prefix / consumer group."""

    def __init__(
        self, stream_prefix: str, consumer_group: str, coordinator_url: str, hint: str = ""
    ) -> None:
        # The hint (the stream's existing groups) comes first: a typo is likelier
        # than a group nobody created.
        super().__init__(
            f"the coordinator at {coordinator_url} has no consumer group {consumer_group!r} "
            f"on stream {stream_prefix!r}; "
            + (f"{hint} Otherwise create" if hint else "create")
            + f" it first: streamkit group create {stream_prefix} {consumer_group} (or declare"
            f" the stream in the app, app.stream({stream_prefix!r}, shards=N), to have it"
            " created at start)"
        )
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group


class MemberRejectedError(StreamkitError):
    """The coordinator refused this member's heartbeats before it ever joined."""


class AssignmentLeaseError(StreamkitError):
    """The local assignment lease would outlive the coordinator's member lease."""


class MemberRuntime:
    """One logical coordinator member: heartbeats, ownership, reader, hooks."""

    def __init__(
        self,
        member_id: str,
        *,
        stream_prefix: str,
        consumer_group: str,
        coordinator: CoordinatorClient,
        redis: AsyncRedis,
        poller: PollerFactory | None = None,
        hooks: ShardLifecycle | None = None,
        lease_ms: int | None = None,
        member_name: str | None = None,
        incarnation: str | None = None,
        static: bool = False,
        coordinator_url: str = "",
        request_timeout_s: float = 5.0,
        redis_release_after_ms: int | None = None,
        redis_url: str = "",
        debug_tracer: trace.Tracer | None = None,
    ) -> None:
        self.machine = MemberStateMachine(
            member_id,
            member_name=member_name,
            lease_ms=lease_ms,
            incarnation=incarnation,
            static=static,
        )
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group
        self.context = ShardContext(
            self.machine,
            stream_prefix=stream_prefix,
            consumer_group=consumer_group,
            redis=redis,
            spawn=self._start_user_task,
        )
        self.poller = poller(self.machine) if poller is not None else None
        self._hooks = hooks
        self._client = coordinator
        self._coordinator_url = coordinator_url
        self._request_timeout_s = request_timeout_s
        self._redis = redis
        self._redis_release_after_ms = redis_release_after_ms
        self._redis_url = redis_url
        self._tg: TaskGroup | None = None
        self._wake = anyio.Event()
        self._stop_requested = False
        self._stop_begun = False
        self._forced = False
        self._answered_once = False
        # Joins are being refused (MEMBER_ID_IN_USE): logged once, until a join works.
        self._id_in_use = False
        # Per shard, the completion event of the last operation queued for it.
        self._tails: dict[int, anyio.Event] = {}
        self._ops: dict[anyio.CancelScope, frozenset[int]] = {}
        #: Set once the coordinator answered a join (tests, readiness probes).
        self.joined = anyio.Event()
        #: Answered heartbeats with their round-trip time, and failed ones (metrics).
        self.heartbeats = Timing()
        #: Set by ``crash()``.
        self.crashed = False
        self._debug_tracer = debug_tracer

    @property
    def member_id(self) -> str:
        return self.machine.member_id

    # -- control -------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the graceful shutdown: drain, then leave."""
        self._stop_requested = True
        self._wake.set()

    def force_stop(self) -> None:
        """Give up on draining: cancel handlers and hooks, then leave at once.

        Safe to leave right away because nothing of ours runs any more.
        """
        self._stop_requested = True
        self._forced = True
        for scope in list(self._ops):
            scope.cancel()
        if self.poller is not None:
            self.poller.close()
        self._wake.set()

    def crash(self) -> None:
        """Stop as a killed process would (tests): no drain, no acks, no leave.

        Handlers and hooks are cancelled and unsent acks dropped; the
        coordinator hands the shards over once the member lease runs out, and
        their unacked entries are delivered again to the next owner.
        """
        self.crashed = True
        for scope in list(self._ops):
            scope.cancel()
        if self.poller is not None:
            self.poller.abort_all()
            self.poller.close()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    def _start_user_task(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._tg is None:
            raise RuntimeError(f"member {self.member_id} is not running")

        async def task() -> None:
            await fn(*args)

        self._tg.start_soon(task, name=f"{self.member_id}:{getattr(fn, '__name__', 'task')}")

    # -- main task -------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            if self.poller is not None:
                await tg.start(self.poller.run)
            task_status.started()
            try:
                await self._heartbeat_loop()
            finally:
                if self.poller is not None:
                    self.poller.close()
                tg.cancel_scope.cancel()

    async def _heartbeat_loop(self) -> None:
        machine = self.machine
        failures = 0
        while True:
            if self._stop_requested:
                if not self._stop_begun:
                    self._stop_begun = True
                    log.info("%s: stopping; draining %s", self.member_id, sorted(machine.reading))
                    stopped = machine.stop()
                    if stopped:
                        self._begin_drain(stopped)
                if self._forced or not (machine.reading or machine.draining):
                    await self._leave()
                    return
            elif self._redis_unreachable():
                await self._release_until_redis_answers()
                failures = 0
                continue
            request = machine.next_request(
                monotonic_ms(),
                in_flight=self.poller.in_flight() if self.poller else None,
                capacity=self.poller.capacity() if self.poller else None,
                progress=self.poller.progress() if self.poller else None,
            )
            try:
                response = await self._send(request, self._request_timeout_ms())
            except (CoordinatorUnavailable, TimeoutError) as exc:
                machine.request_failed()
                failures += 1
                self._log_failure(exc, failures)
                delay_ms = self._retry_delay_ms(failures)
            except CoordinatorError as exc:
                machine.request_failed()
                if exc.error_code == MEMBER_ID_IN_USE:
                    # Another process holds this member id: read nothing and
                    # ask again each interval; it frees up when that process
                    # leaves or its lease runs out (a restart after a crash).
                    self._log_id_in_use(exc)
                    await self._sleep(machine.heartbeat_interval_ms)
                    continue
                if not self._answered_once and exc.status_code in (401, 403, 404):
                    raise self._fatal(exc) from exc
                failures += 1
                self._log_failure(exc, failures)
                delay_ms = self._retry_delay_ms(failures)
            else:
                if self._id_in_use:
                    log.info("%s: the member id is free again; joined", self.member_id)
                    self._id_in_use = False
                if failures:
                    log.info(
                        "%s: coordinator reachable again after %d failures",
                        self.member_id,
                        failures,
                    )
                failures = 0
                delay_ms = await self._on_response(response)
            await self._sleep(delay_ms)

    async def _send(self, request: HeartbeatRequest, timeout_ms: int) -> HeartbeatResponse:
        span = None
        if self._debug_tracer is not None:
            span = self._debug_tracer.start_span("streamkit heartbeat", kind=SpanKind.CLIENT)
            if span.is_recording():
                span.set_attribute("streamkit.member_id", self.member_id)
                span.set_attribute("streamkit.epoch", request.member_epoch)
        started = time.perf_counter()
        try:
            with anyio.fail_after(timeout_ms / 1000):
                response = await self._client.heartbeat(
                    self.stream_prefix, self.consumer_group, request
                )
        except Exception as exc:  # not cancellation: a stop is no failed heartbeat
            self.heartbeats.failures += 1
            end_span(span, exc)
            raise
        except BaseException:
            end_span(span, None)
            raise
        self.heartbeats.add(time.perf_counter() - started)
        end_span(span, None)
        return response

    async def _on_response(self, response: HeartbeatResponse) -> int:
        """Apply an answer; returns how long to wait before the next heartbeat."""
        machine = self.machine
        first = not self._answered_once
        self._answered_once = True
        if isinstance(response, HeartbeatAnswer) and response.member_lease_ttl_ms is not None:
            self._check_lease(response.member_lease_ttl_ms, first)
        reactions = machine.on_response(response)
        delay_ms = machine.heartbeat_interval_ms
        for reaction in reactions:
            if reaction.kind is ReactionKind.START:
                log.info(
                    "%s: assigned shards %s (epoch %d)",
                    self.member_id,
                    sorted(reaction.shards),
                    machine.epoch,
                )
                self._spawn(reaction.shards, self._assign)
            elif reaction.kind is ReactionKind.DRAIN:
                log.info(
                    "%s: revoking shards %s (%s)",
                    self.member_id,
                    sorted(reaction.shards),
                    reaction.status,
                )
                self._begin_drain(reaction.shards)
            elif reaction.kind is ReactionKind.LOST:
                await self._lose(reaction)
                delay_ms = 0  # rejoin (epoch 0, empty ownership) right away
            else:
                self._reject(reaction, first)
                delay_ms = self._retry_delay_ms(1)
        if machine.epoch > 0:
            self.joined.set()
        if self.poller is not None:
            self.poller.notify()
        return delay_ms

    def _check_lease(self, coordinator_ttl_ms: int, first: bool) -> None:
        """Refuse a local lease that outlives the coordinator's member lease.

        The coordinator hands a silent member's shards away once its lease TTL
        has passed since the last heartbeat it received; a member reading for
        longer than that after its last answered heartbeat would read next to
        the new owner.  (The default, two heartbeat intervals, always fits.)
        """
        local = self.machine.lease_ms
        if local is None or local <= coordinator_ttl_ms:
            return
        message = (
            f"STREAMKIT_ASSIGNMENT_LEASE_MS={local} exceeds the coordinator's member lease "
            f"TTL ({coordinator_ttl_ms} ms): member {self.member_id} could keep reading after "
            "the coordinator hands its shards to another member; set it to at most "
            f"{coordinator_ttl_ms} or leave it unset"
        )
        if first:
            raise AssignmentLeaseError(message)
        # The coordinators were reconfigured under a running member: stay safe.
        log.error("%s; using %d ms from now on", message, coordinator_ttl_ms)
        self.machine.lease_ms = coordinator_ttl_ms

    def _reject(self, reaction: Reaction, first: bool) -> None:
        message = (
            f"coordinator rejected member {self.member_id} of "
            f"{self.stream_prefix}/{self.consumer_group}: {reaction.status}"
        )
        if first:
            raise MemberRejectedError(message)
        log.error("%s; retrying", message)

    def _fatal(self, exc: CoordinatorError) -> StreamkitError:
        if exc.status_code == 404:
            return GroupNotFoundError(
                self.stream_prefix, self.consumer_group, self._coordinator_url
            )
        return MemberRejectedError(
            f"member {self.member_id} may not heartbeat on {self.stream_prefix}/"
            f"{self.consumer_group}: {exc} (check STREAMKIT_COORDINATOR_USERNAME/_PASSWORD/"
            "_TOKEN and the MEMBER role)"
        )

    # -- shard operations ------------------------------------------------------

    def _spawn(
        self, shards: frozenset[int], operation: Callable[[frozenset[int]], Awaitable[None]]
    ) -> None:
        """Run ``operation(shards)`` after every earlier operation on those shards."""
        assert self._tg is not None
        previous = {self._tails[s] for s in shards if s in self._tails}
        done = anyio.Event()
        for shard in shards:
            self._tails[shard] = done
        scope = anyio.CancelScope()
        self._ops[scope] = shards
        self._tg.start_soon(self._run_op, scope, previous, done, operation, shards)

    async def _run_op(
        self,
        scope: anyio.CancelScope,
        previous: set[anyio.Event],
        done: anyio.Event,
        operation: Callable[[frozenset[int]], Awaitable[None]],
        shards: frozenset[int],
    ) -> None:
        try:
            with scope:
                for event in previous:
                    await event.wait()
                await operation(shards)
        finally:
            self._ops.pop(scope, None)
            done.set()
            for shard in shards:
                if self._tails.get(shard) is done:
                    del self._tails[shard]

    async def _assign(self, shards: frozenset[int]) -> None:
        if self._hooks is not None:
            await self._call_hook("on_assigned", self._hooks.on_assigned, shards)
        if self.poller is not None:
            # A revoke or loss may have come in meanwhile; may_read guards
            # reads anyway, this just avoids starting a loop for nothing.
            still = shards & self.machine.reading
            if still:
                self.poller.start(frozenset(still))

    def _begin_drain(self, shards: frozenset[int]) -> None:
        if self.poller is not None:
            self.poller.halt(shards)  # no new read from this instant on
        self._spawn(shards, self._revoke)

    async def _revoke(self, shards: frozenset[int]) -> None:
        if self.poller is not None:
            await self.poller.drain(shards)
        if self._hooks is not None and not await self._call_hook(
            "on_revoked", self._hooks.on_revoked, shards
        ):
            # A failed on_revoked cannot vouch that nothing is in flight, so the
            # shards are never reported REVOKED: they stay draining until the
            # coordinator's rebalance timeout fences this member, which is safe.
            log.error(
                "%s: on_revoked failed; shards %s stay draining until the rebalance timeout",
                self.member_id,
                sorted(shards),
            )
            return
        for shard in shards:
            self.machine.drained(shard)
        log.info("%s: drained shards %s", self.member_id, sorted(shards))
        self._wake.set()  # report REVOKED now, not one interval later

    async def _lose(self, reaction: Reaction) -> None:
        log.warning(
            "%s: %s; stopping shards %s and rejoining with epoch 0",
            self.member_id,
            reaction.status,
            sorted(reaction.shards),
        )
        # Everything this member did is void: stop hooks still draining or
        # assigning (a stuck on_revoked is the usual reason for a fence).
        for scope in list(self._ops):
            scope.cancel()
        self._tails.clear()
        if self.poller is not None:
            self.poller.abort_all()
        if self._hooks is not None:
            await self._call_hook("on_lost", self._hooks.on_lost, reaction.shards)

    async def _call_hook(
        self,
        name: str,
        hook: Callable[[frozenset[int], ShardContext], Awaitable[None]],
        shards: frozenset[int],
    ) -> bool:
        """Run a lifecycle hook; False (logged) when it raised."""
        try:
            await hook(shards, self.context)
        except Exception:
            log.exception("%s: %s(%s) failed", self.member_id, name, sorted(shards))
            return False
        return True

    # -- Redis unreachable -----------------------------------------------------------

    def _redis_unreachable(self) -> bool:
        if self.poller is None or self._redis_release_after_ms is None:
            return False  # a custom reader judges its own Redis access
        if not (self.machine.reading or self.machine.draining):
            return False  # nothing held, nothing to give back
        return self.poller.reachability.should_release(monotonic_ms(), self._redis_release_after_ms)

    async def _release_until_redis_answers(self) -> None:
        """Give the shards back (drain briefly, then leave), wait until Redis
        answers a PING, then join again from scratch.

        A member that cannot read its shards must not hold them: heartbeats
        alone would keep them here for as long as the process runs.
        """
        assert self.poller is not None
        machine = self.machine
        reach = self.poller.reachability
        now = monotonic_ms()
        log.warning(
            "%s: no successful read or ack from Redis at %s for %.1fs (%s); giving back "
            "shards %s and leaving the group until Redis answers again "
            "(check STREAMKIT_REDIS_URL and that redis-server is running)",
            self.member_id,
            self._redis_url or self.poller.redis_address,
            reach.failing_for_ms(now) / 1000,
            describe_error(reach.last_error) if reach.last_error else "no answer",
            sorted(machine.reading | machine.draining),
        )
        stopped = machine.stop()
        if stopped:
            self._begin_drain(stopped)
        # Handlers may still finish, but acks cannot reach Redis, so do not
        # wait long: what stays unacked is pending for the next owner.
        with anyio.move_on_after(_RELEASE_DRAIN_S) as waited:
            for done in list(self._tails.values()):
                await done.wait()
        for scope in list(self._ops):
            scope.cancel()
        self._tails.clear()
        self.poller.abort_all()
        if waited.cancelled_caught:
            # A handler may still be running: a leave would hand its shard to
            # another member at once.  Stay silent instead; the coordinator
            # frees the shards when the member lease runs out.
            log.warning(
                "%s: handlers still running; not leaving, the shards move when the "
                "member lease runs out",
                self.member_id,
            )
        else:
            await self._leave(for_restart=False)
        machine.start_over()
        self._answered_once = False  # the next answer is a new join
        failures = 0
        while not self._stop_requested:
            try:
                with anyio.fail_after(self._request_timeout_s):
                    await self._redis.ping()
            except (RedisError, OSError, TimeoutError) as exc:
                failures += 1
                if failures % 10 == 0:
                    log.warning(
                        "%s: Redis at %s still unreachable (%s)",
                        self.member_id,
                        self._redis_url or self.poller.redis_address,
                        describe_error(exc),
                    )
                await self._sleep(self._retry_delay_ms(failures))
                continue
            reach.succeeded()
            log.info("%s: Redis answers again; joining the group", self.member_id)
            return

    # -- leaving ------------------------------------------------------------------

    async def _leave(self, *, for_restart: bool = True) -> None:
        if not self._answered_once and self.machine.epoch == 0:
            return  # never joined: nothing to leave
        for attempt in range(1, _LEAVE_ATTEMPTS + 1):
            request = self.machine.leave_request(monotonic_ms(), for_restart=for_restart)
            try:
                response = await self._send(request, self._request_timeout_ms())
            except (CoordinatorUnavailable, CoordinatorError, TimeoutError) as exc:
                self.machine.request_failed()
                if attempt == _LEAVE_ATTEMPTS:
                    log.warning(
                        "%s: could not leave (%r); the coordinator will expire the member "
                        "after its lease",
                        self.member_id,
                        exc,
                    )
                    return
                await anyio.sleep(self._retry_delay_ms(attempt) / 1000)
                continue
            if response.status is HeartbeatStatus.INVALID_REQUEST and self.machine.static:
                # A coordinator without static leaves (the reference server):
                # leave the plain way, the shards move at once.
                self.machine.static = False
                continue
            self.machine.on_response(response)
            log.info("%s: left the group", self.member_id)
            return

    # -- timing ---------------------------------------------------------------------

    def _request_timeout_ms(self) -> int:
        """A heartbeat may take as long as the lease has left, but at least an
        interval: a hung coordinator must not keep us from trying again."""
        interval = self.machine.heartbeat_interval_ms
        remaining = self.machine.lease_remaining_ms(monotonic_ms())
        return int(min(self._request_timeout_s * 1000, max(interval, remaining)))

    def _retry_delay_ms(self, failures: int) -> int:
        interval = self.machine.heartbeat_interval_ms
        cap = max(interval, min(_RETRY_CAP_MS, 10 * interval))
        if self.machine.lease_valid(monotonic_ms()):
            # Keep the lease alive: at least one attempt per interval.
            cap = min(cap, interval)
        return int(jittered_backoff(failures, _RETRY_BASE_MS, cap, random.random()))

    async def _sleep(self, delay_ms: int) -> None:
        if delay_ms > 0 and not self._wake.is_set():
            with anyio.move_on_after(delay_ms / 1000):
                await self._wake.wait()
        if self._wake.is_set():
            self._wake = anyio.Event()

    def _log_id_in_use(self, exc: CoordinatorError) -> None:
        if not self._id_in_use:
            self._id_in_use = True
            log.error(
                "%s: %s. This process reads nothing for this member and asks again every "
                "heartbeat interval. Only with STREAMKIT_STATIC_MEMBERSHIP=true do two "
                "processes with the same STREAMKIT_MEMBER_ID_BASE share member ids: give "
                "each process its own base.",
                self.member_id,
                exc,
            )

    def _log_failure(self, exc: BaseException, failures: int) -> None:
        if failures == 1 or failures % 10 == 0:
            if not self.machine.joined:
                lease = "not joined yet"
            elif self.machine.lease_valid(monotonic_ms()):
                lease = "lease valid"
            else:
                lease = "lease expired"
            log.warning(
                "%s: heartbeat failed (%d in a row, %s): %s",
                self.member_id,
                failures,
                lease,
                exc or repr(exc),
            )

    def __repr__(self) -> str:
        return (
            f"<MemberRuntime {self.member_id} epoch={self.machine.epoch} "
            f"reading={sorted(self.machine.reading)} draining={sorted(self.machine.draining)}>"
        )
