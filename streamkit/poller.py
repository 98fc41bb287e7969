"""The built-in reader of one member: a fair ``XREADGROUP`` poller.

Design (SPEC §5):

* One ``ShardSession`` (one read loop) per owned shard, never more: a
  multi-key ``XREADGROUP`` would fail with CROSSSLOT in Redis Cluster, and one
  loop per shard keeps each shard's entries in order.
* In-flight work of the member is bounded by a ``FairGate`` of
  ``max_in_flight`` tokens.  A session takes up to ``batch_size`` tokens
  before it reads and gives them back when the batch is handled.  Waiters are
  served first come, first served and a session that just finished a batch
  queues behind the others, so shards take turns (round-robin) and none
  starves, even when the member owns far more shards than it has tokens.
* A session reads without ``BLOCK`` while its shard has a backlog.  Only once
  a read comes back empty does it block, asking for a single entry, so idle
  shards never sit on tokens a busy shard could use.  ``BLOCK`` is bounded by
  the remaining assignment lease, so no read outlives it.
* Before every read the session asks the member's state machine
  (``may_read``): a revoked or lost shard, or an expired lease, stops reads
  at once.  A revoke also cancels a blocking read in progress.
* A newly assigned shard first claims what the group still has pending
  (``XAUTOCLAIM`` with min-idle 0): the coordinator hands a shard over only
  after the previous owner reported it drained, was fenced, or let its lease
  expire, so nobody else is reading those entries any more.
* Acks are batched per shard: ``msg.ack()`` queues the id and one ``XACK``
  (or ``XACKDEL`` / ``MULTI XACK+XDEL``) goes out after each batch and before
  the shard is reported revoked.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus
from redis.exceptions import RedisError, ResponseError

from streamkit.connections import AsyncRedis, redis_address
from streamkit.lifecycle import monotonic_ms
from streamkit.member import MemberStateMachine
from streamkit.message import Message, Settlement
from streamkit.protocol import RuntimeConsumerCapacity, ShardConsumptionProgress, ShardId
from streamkit.redis_health import RedisReachability, describe_error, is_unreachable_error
from streamkit.routing import stream_key

__all__ = [
    "FairGate",
    "Handler",
    "PollerOptions",
    "ReadObserver",
    "ShardPoller",
    "supports_xackdel",
]

log = logging.getLogger("streamkit.poller")

Handler = Callable[[Message], Awaitable[None]]

# A blocking read ends this long before the lease does, so the server-side
# BLOCK timeout plus network delay and event-loop lag still lands inside the
# lease (a read still running at lease end is abandoned: see _within_lease).
_LEASE_MARGIN_MS = 100
_MIN_BLOCK_MS = 5
_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 5.0
_END_OF_PEL = b"0-0"
_FINAL_FLUSH_S = 5.0


@dataclass(frozen=True, slots=True)
class PollerOptions:
    batch_size: int = 100
    #: Entries read but not yet handled, per member (the heartbeat reports it
    #: as runtimeMaxConcurrency).
    max_in_flight: int = 400
    #: Longest BLOCK of an idle read; the lease may cut it shorter.
    block_ms: int = 2_000
    #: Handle a shard's entries one after another, in stream order.  False:
    #: a batch's handlers run concurrently.
    ordered: bool = True
    #: Ack after the handler returns without raising (unless it settled the
    #: message itself).
    auto_ack: bool = False
    #: Claim the group's pending entries when a shard is assigned.
    claim_pending: bool = True


class ReadObserver(Protocol):
    """Sees every read a poller issues (metrics, tracing, tests).

    ``read_started`` is called right before a read command is sent and
    ``read_finished`` once it returned, failed or was cancelled, so the pair
    brackets the whole time the read can be executing in Redis.
    """

    def read_started(self, shard: int, member_id: str, epoch: int) -> None: ...

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None: ...


async def supports_xackdel(redis: AsyncRedis) -> bool:
    """Whether the server has ``XACKDEL`` (Redis 8.2+); decided once at start-up.

    Probes with an ``XACKDEL`` on a key that does not exist, which changes
    nothing where the command exists.  ``COMMAND INFO`` would be the polite
    question, but redis-py cannot parse its answer for an unknown command.
    """
    try:
        await redis.execute_command("XACKDEL", "streamkit:probe:xackdel", "probe", "IDS", 1, "0-1")
    except ResponseError as exc:
        if "unknown command" in str(exc).lower():
            return False
        raise
    return True


# --------------------------------------------------------------------------
# Fair capacity
# --------------------------------------------------------------------------


class _Waiter:
    __slots__ = ("event", "granted", "want")

    def __init__(self, want: int) -> None:
        self.want = want
        self.granted = 0
        self.event = anyio.Event()


class FairGate:
    """A counting semaphore that grants in arrival order, partially if need be.

    ``acquire(n)`` returns between 1 and ``n`` tokens.  A waiter at the head of
    the queue takes what is free instead of waiting for all it asked for, so a
    large request cannot hold up the line, and nobody jumps the queue while
    anyone waits.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.available = capacity
        self._waiters: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_acquire(self, want: int) -> int:
        """Tokens granted at once (0 if someone is queued or none are free)."""
        if self._waiters or self.available == 0:
            return 0
        granted = min(want, self.available)
        self.available -= granted
        return granted

    async def acquire(self, want: int) -> int:
        if want < 1:
            raise ValueError("want must be >= 1")
        granted = self.try_acquire(want)
        if granted:
            return granted
        waiter = _Waiter(want)
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            # Cancelled: hand back a grant that raced the cancellation, or
            # leave the queue.
            if waiter.granted:
                self.release(waiter.granted)
            else:
                self._waiters.remove(waiter)
            raise
        return waiter.granted

    def release(self, count: int) -> None:
        if count <= 0:
            return
        self.available += count
        if self.available > self.capacity:
            raise RuntimeError("FairGate released more tokens than it granted")
        while self._waiters and self.available:
            waiter = self._waiters.popleft()
            waiter.granted = min(waiter.want, self.available)
            self.available -= waiter.granted
            waiter.event.set()


# --------------------------------------------------------------------------
# One shard
# --------------------------------------------------------------------------


def _id_key(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def _later(a: bytes | None, b: bytes) -> bytes:
    return b if a is None or _id_key(b) > _id_key(a) else a


class ShardSession:
    """The read loop of one shard for one assignment of it."""

    def __init__(self, poller: ShardPoller, shard: int) -> None:
        self._poller = poller
        self.shard = shard
        self.stream_key = stream_key(poller.stream_prefix, shard)
        self.consumer_group = poller.consumer_group
        self.member_id = poller.member_id
        self.stopping = False  # no new reads (revoked, stopping, lost)
        self.aborted = False  # lost: no acks, no further handlers
        self.in_flight = 0
        self.finished = anyio.Event()
        self.last_delivered_id: bytes | None = None
        self.last_acked_id: bytes | None = None
        self.pending_count = 0
        self._acks: list[bytes] = []
        self._ack_dels: list[bytes] = []
        # Our own pending entries to fetch again (nacked, or skipped when the
        # lease lapsed mid-batch): XCLAIM to ourselves before reading new ones.
        self._redeliver: list[bytes] = []
        self._claiming = poller.options.claim_pending
        self._claim_cursor = _END_OF_PEL
        self._idle = False
        # Cancelled by halt(): the blocking read and every wait, never a handler.
        self._interruptible: anyio.CancelScope | None = None

    # -- control (called by the poller) --------------------------------------

    def halt(self) -> None:
        self.stopping = True
        if self._interruptible is not None:
            self._interruptible.cancel()

    def abort(self) -> None:
        self.aborted = True
        self._acks.clear()
        self._ack_dels.clear()
        self.halt()

    def settle(self, message_id: bytes, how: Settlement) -> None:
        if self.aborted or self.finished.is_set():
            # Lost: another member may own the shard now (seed 004: stop
            # acking).  Finished: settled after the handler returned.
            log.debug(
                "ignoring %s of %s %r: shard no longer held", how.value, self.stream_key, message_id
            )
            return
        if how is Settlement.ACK:
            self._acks.append(message_id)
        elif how is Settlement.ACK_DEL:
            self._ack_dels.append(message_id)
        else:
            self._redeliver.append(message_id)

    def may_read(self) -> bool:
        return not self.stopping and self._poller.machine.may_read(self.shard, monotonic_ms())

    # -- the loop --------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            # Shielded: a forced stop cancels handlers, but acks of the ones
            # that finished are still worth sending (bounded: Redis may be gone).
            with anyio.move_on_after(_FINAL_FLUSH_S, shield=True):
                if not self.aborted:
                    await self._flush(final=True)
            self.finished.set()
            self._poller._session_finished(self)

    async def _loop(self) -> None:
        poller = self._poller
        failures = 0
        while not self.stopping:
            if not self.may_read():
                await self._interruptibly(poller.wait_for_change())
                continue
            want = 1 if self._idle else poller.options.batch_size
            granted = await self._interruptibly(poller.gate.acquire(want))
            if not granted:
                continue
            error: BaseException | None = None
            try:
                if self.may_read():
                    try:
                        entries, redelivered = await self._read_within_lease(granted)
                    except (RedisError, OSError) as exc:
                        error = exc
                        if is_unreachable_error(exc):
                            poller.reachability.failed(monotonic_ms(), exc)
                    else:
                        failures = 0
                        poller.reachability.succeeded()
                        if entries:
                            await self._handle(entries, redelivered)
                            await self._flush()
            finally:
                poller.gate.release(granted)
            if error is not None:
                # Back off (no hot loop on NOGROUP or a Redis outage) without
                # holding tokens that other shards could use.
                failures += 1
                self._log_read_error(error, failures)
                await self._interruptibly(anyio.sleep(_backoff_s(failures)))

    async def _read_within_lease(self, count: int) -> tuple[list[tuple[bytes, Any]], bool]:
        """``_read_batch``, but no Redis command of it outlives the assignment lease."""
        try:
            return await self._read_batch(count)
        except _LeaseCut:
            log.warning(
                "%s: Redis did not answer a read of %s before the assignment lease ended; "
                "abandoned it",
                self.member_id,
                self.stream_key,
            )
            # The command may still have run in Redis: whatever it delivered
            # is pending for us, so fetch pending entries again before new
            # ones once the lease is renewed (only while the shard is ours).
            if self._poller.options.claim_pending:
                self._claiming = True
                self._claim_cursor = _END_OF_PEL
            return [], False

    async def _within_lease(self, command: Awaitable[Any]) -> Any:
        """Await one Redis command; raise ``_LeaseCut`` if the lease ends first.

        A Redis that stops answering (paused, black-holed) must not keep a
        read going past the lease: by then the coordinator may hand the shard
        to another member.  Cancelling drops the connection, so a reply that
        arrives later is never handled.
        """
        remaining_ms = self._poller.machine.lease_remaining_ms(monotonic_ms())
        with anyio.move_on_after(remaining_ms / 1000):
            return await command
        raise _LeaseCut

    async def _read_batch(self, count: int) -> tuple[list[tuple[bytes, Any]], bool]:
        """The next entries: claimed leftovers first, then redeliveries, then new."""
        if self._claiming:
            entries, self._claiming = await self._claim(count)
            return entries, True
        if self._redeliver:
            return await self._reclaim(count), True
        entries = await self._read_new(count, block=self._idle)
        self._idle = not entries
        return entries, False

    async def _interruptibly(self, awaitable: Awaitable[Any]) -> Any:
        """Await ``awaitable`` unless ``halt()`` comes first (then: None)."""
        result = None
        with anyio.CancelScope() as scope:
            self._interruptible = scope
            if self.stopping:
                scope.cancel()
            try:
                result = await awaitable
            finally:
                self._interruptible = None
        return result

    # -- reads -------------------------------------------------------------------

    async def _read_new(self, count: int, *, block: bool) -> list[tuple[bytes, Any]]:
        poller = self._poller
        block_ms: int | None = None
        if block:
            remaining = poller.machine.lease_remaining_ms(monotonic_ms()) - _LEASE_MARGIN_MS
            block_ms = min(poller.options.block_ms, remaining)
            if block_ms < _MIN_BLOCK_MS:
                # Too little lease left to block; wait for the next heartbeat.
                await self._interruptibly(poller.wait_for_change())
                return []
        reply: Any
        with self._observed_read() as tally:
            if block_ms is None:
                reply = await self._within_lease(
                    poller.redis.xreadgroup(
                        self.consumer_group, self.member_id, {self.stream_key: ">"}, count=count
                    )
                )
            else:
                reply = await self._interruptibly(
                    self._within_lease(
                        poller.redis.xreadgroup(
                            self.consumer_group,
                            self.member_id,
                            {self.stream_key: ">"},
                            count=count,
                            block=block_ms,
                        )
                    )
                )
            entries = _entries_of(reply)
            tally.count = len(entries)
        self.pending_count += tally.count
        return entries

    async def _claim(self, count: int) -> tuple[list[tuple[bytes, Any]], bool]:
        """One XAUTOCLAIM step; returns the entries and whether to go on claiming."""
        poller = self._poller
        reply: Any
        with self._observed_read() as tally:
            reply = await self._within_lease(
                poller.redis.xautoclaim(
                    self.stream_key,
                    self.consumer_group,
                    self.member_id,
                    0,
                    self._claim_cursor,
                    count=count,
                )
            )
            cursor: bytes = reply[0]
            entries: list[tuple[bytes, Any]] = [e for e in reply[1] if e[1] is not None]
            tally.count = len(entries)
        self._claim_cursor = cursor
        self.pending_count += tally.count
        if entries:
            log.debug(
                "%s claimed %d pending entries of %s", self.member_id, tally.count, self.stream_key
            )
        if cursor == _END_OF_PEL:
            await self._forget_idle_consumers()
        return entries, cursor != _END_OF_PEL

    async def _forget_idle_consumers(self) -> None:
        """Delete the other Redis consumers of this shard that hold nothing.

        Member ids are drawn anew on every start, so without this the group's
        consumer list grows with every restart.  Safe once we hold the shard
        and claimed its leftovers: no other member reads it while we do, so an
        empty consumer stays empty until we delete it (a consumer that still
        has pending entries is kept: deleting it would drop them unredelivered).
        A member given the shard later simply creates its consumer again.
        """
        poller = self._poller
        try:
            consumers = await poller.redis.xinfo_consumers(self.stream_key, self.consumer_group)
            for consumer in consumers:
                name = consumer["name"]
                name = name.decode() if isinstance(name, bytes) else str(name)
                if name != self.member_id and int(consumer["pending"]) == 0:
                    await poller.redis.xgroup_delconsumer(
                        self.stream_key, self.consumer_group, name
                    )
        except RedisError as exc:  # housekeeping only: try again on the next grant
            log.debug("%s: consumers of %s kept: %r", self.member_id, self.stream_key, exc)

    async def _reclaim(self, count: int) -> list[tuple[bytes, Any]]:
        """Fetch our own pending entries again (XCLAIM to ourselves, min-idle 0)."""
        poller = self._poller
        ids, self._redeliver = self._redeliver[:count], self._redeliver[count:]
        reply: Any
        with self._observed_read() as tally:
            try:
                reply = await self._within_lease(
                    poller.redis.xclaim(
                        self.stream_key, self.consumer_group, self.member_id, 0, list[Any](ids)
                    )
                )
            except BaseException:
                self._redeliver[:0] = ids
                raise
            entries: list[tuple[bytes, Any]] = [e for e in reply if e[1] is not None]
            tally.count = len(entries)
        return entries

    @contextlib.contextmanager
    def _observed_read(self) -> Iterator[_Tally]:
        """Bracket one Redis read for the read observer (tests rebuild read
        intervals from it to prove no shard ever had two readers)."""
        observer = self._poller.observer
        epoch = self._poller.machine.epoch
        tally = _Tally()
        if observer is not None:
            observer.read_started(self.shard, self.member_id, epoch)
        try:
            yield tally
        finally:
            if observer is not None:
                observer.read_finished(self.shard, self.member_id, epoch, tally.count)

    def _log_read_error(self, exc: BaseException, failures: int) -> None:
        if failures != 1 and failures % 10:
            return
        if isinstance(exc, ResponseError) and str(exc).startswith("NOGROUP"):
            # Never recreated here: the coordinator provisions streams and
            # groups together, so a stream without its group was deleted on
            # purpose (and MKSTREAM would resurrect a retired shard).
            log.error(
                "%s: consumer group %r is missing on %s (failure %d); retrying with backoff. "
                "Re-provision the group through the coordinator.",
                self.member_id,
                self.consumer_group,
                self.stream_key,
                failures,
            )
        else:
            log.warning(
                "%s: reading %s from Redis at %s failed (failure %d): %s",
                self.member_id,
                self.stream_key,
                self._poller.redis_address,
                failures,
                describe_error(exc),
            )

    # -- handling ----------------------------------------------------------------

    async def _handle(self, entries: list[tuple[bytes, Any]], redelivered: bool) -> None:
        poller = self._poller
        shard = self.shard
        self.last_delivered_id = _later(self.last_delivered_id, entries[-1][0])
        messages = [
            Message(self, shard, entry_id, fields, redelivered=redelivered)
            for entry_id, fields in entries
        ]
        self.in_flight = len(messages)
        invoke = poller.invoke
        try:
            if poller.options.ordered:
                machine = poller.machine
                for index, message in enumerate(messages):
                    # Start nothing once the shard may not be read: the rest
                    # stays pending, for whoever owns the shard next or, if
                    # only the lease lapsed, for us once it is renewed.
                    if self.stopping or not machine.may_read(shard, monotonic_ms()):
                        if not self.stopping:
                            self._redeliver.extend(m.raw_id for m in messages[index:])
                        break
                    await invoke(message)
                    self.in_flight -= 1
            else:
                async with anyio.create_task_group() as tg:
                    for message in messages:
                        tg.start_soon(invoke, message)
        finally:
            self.in_flight = 0

    async def _flush(self, *, final: bool = False) -> None:
        acks, dels = self._acks, self._ack_dels
        if not acks and not dels:
            return
        self._acks, self._ack_dels = [], []
        redis = self._poller.redis
        attempts = 3 if final else 1
        for attempt in range(1, attempts + 1):
            try:
                if not dels:
                    await redis.xack(self.stream_key, self.consumer_group, *acks)
                elif self._poller.xackdel:
                    pipe = redis.pipeline(transaction=False)
                    if acks:
                        pipe.xack(self.stream_key, self.consumer_group, *acks)
                    pipe.execute_command(
                        "XACKDEL", self.stream_key, self.consumer_group, "IDS", len(dels), *dels
                    )
                    await pipe.execute()
                else:
                    # Redis < 8.2: XACK + XDEL atomically on the one shard key.
                    pipe = redis.pipeline(transaction=True)
                    pipe.xack(self.stream_key, self.consumer_group, *acks, *dels)
                    pipe.xdel(self.stream_key, *dels)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                if is_unreachable_error(exc):
                    self._poller.reachability.failed(monotonic_ms(), exc)
                if attempt < attempts:
                    await anyio.sleep(_backoff_s(attempt))
                    continue
                if final:
                    # Unacked entries stay pending and are redelivered to the
                    # next owner: a duplicate, never a loss.
                    log.warning(
                        "%s: could not ack %d entries of %s: %s",
                        self.member_id,
                        len(acks) + len(dels),
                        self.stream_key,
                        describe_error(exc),
                    )
                else:
                    log.warning(
                        "%s: ack of %s failed, will retry: %s",
                        self.member_id,
                        self.stream_key,
                        describe_error(exc),
                    )
                    self._acks[:0] = acks
                    self._ack_dels[:0] = dels
                return
            break
        self._poller.reachability.succeeded()
        self.pending_count = max(0, self.pending_count - len(acks) - len(dels))
        if acks:
            self.last_acked_id = _later(self.last_acked_id, acks[-1])
        if dels:
            self.last_acked_id = _later(self.last_acked_id, dels[-1])

    def progress(self) -> ShardConsumptionProgress:
        return ShardConsumptionProgress(
            shard=ShardId(shard_index=self.shard),
            stream_key=self.stream_key,
            last_delivered_id=self.last_delivered_id.decode() if self.last_delivered_id else None,
            last_acked_id=self.last_acked_id.decode() if self.last_acked_id else None,
            pending_count=self.pending_count,
        )


class _LeaseCut(Exception):
    """A Redis command was abandoned because the assignment lease ended."""


@dataclass(slots=True)
class _Tally:
    count: int = 0


def _entries_of(reply: Any) -> list[tuple[bytes, Any]]:
    """The entries of a one-stream XREADGROUP reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        entries: list[tuple[bytes, Any]] = next(iter(reply.values()))[0]
        return entries
    entries = reply[0][1]
    return entries


def _backoff_s(failures: int) -> float:
    ceiling = min(_BACKOFF_MAX_S, _BACKOFF_MIN_S * 2.0 ** min(failures - 1, 16))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


# --------------------------------------------------------------------------
# The member's poller
# --------------------------------------------------------------------------


class ShardPoller:
    """All read loops of one member, sharing its in-flight budget."""

    def __init__(
        self,
        machine: MemberStateMachine,
        redis: AsyncRedis,
        *,
        stream_prefix: str,
        consumer_group: str,
        handler: Handler,
        options: PollerOptions,
        xackdel: bool = False,
        observer: ReadObserver | None = None,
    ) -> None:
        self.machine = machine
        self.redis = redis
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group
        self.member_id = machine.member_id
        self.options = options
        self.xackdel = xackdel
        self.observer = observer
        self.gate = FairGate(options.max_in_flight)
        #: Outcomes of reads and acks: the member gives its shards back when
        #: Redis stays unreachable (see ``streamkit.redis_health``).
        self.reachability = RedisReachability()
        self.redis_address = redis_address(redis)
        self._handler = handler
        self._sessions: dict[int, ShardSession] = {}
        self._changed = anyio.Event()
        self._closed = anyio.Event()
        self._tg: TaskGroup | None = None

    # -- task ----------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the read loops; returns after ``close()`` (or cancellation)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await self._closed.wait()
            tg.cancel_scope.cancel()
        self._tg = None

    def close(self) -> None:
        """Stop hosting: cancels whatever still runs (handlers included)."""
        self._closed.set()

    # -- ownership -------------------------------------------------------------------

    def start(self, shards: frozenset[int]) -> None:
        if self._tg is None:
            raise RuntimeError("ShardPoller.start() before run()")
        for shard in sorted(shards):
            old = self._sessions.get(shard)
            if old is not None and not old.stopping:
                continue  # already reading it
            session = self._sessions[shard] = ShardSession(self, shard)
            self._tg.start_soon(session.run, name=f"streamkit-read-{session.stream_key}")

    def halt(self, shards: frozenset[int]) -> None:
        """Stop new reads of ``shards`` now (in-flight handlers go on)."""
        for shard in shards:
            session = self._sessions.get(shard)
            if session is not None:
                session.halt()

    async def drain(self, shards: frozenset[int]) -> None:
        """Stop reading ``shards`` and wait until their work is done and acked."""
        sessions = [s for s in (self._sessions.get(shard) for shard in shards) if s is not None]
        for session in sessions:
            session.halt()
        for session in sessions:
            await session.finished.wait()

    def abort(self, shards: frozenset[int]) -> None:
        """Lost: stop reading and acking at once; do not wait for handlers."""
        for shard in shards:
            session = self._sessions.pop(shard, None)
            if session is not None:
                session.abort()

    def abort_all(self) -> None:
        self.abort(frozenset(self._sessions))

    def _session_finished(self, session: ShardSession) -> None:
        if self._sessions.get(session.shard) is session:
            del self._sessions[session.shard]

    # -- coordination with the heartbeat loop ------------------------------------------

    def notify(self) -> None:
        """The member's state changed (a heartbeat answered): re-check leases."""
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for_change(self) -> None:
        await self._changed.wait()

    # -- handler -----------------------------------------------------------------------

    async def invoke(self, message: Message) -> None:
        try:
            await self._handler(message)
        except Exception:
            # At-least-once: the entry stays pending (redelivered on the next
            # claim of this shard); the listener keeps going.
            log.exception(
                "handler failed for %s entry %s (group %s, member %s); it stays pending",
                message.stream_key,
                message.id,
                self.consumer_group,
                self.member_id,
            )
            return
        if self.options.auto_ack and message.settled is None:
            message.ack()

    # -- reports -----------------------------------------------------------------------

    def in_flight(self) -> dict[int, int]:
        return {shard: s.in_flight for shard, s in self._sessions.items() if s.in_flight}

    def capacity(self) -> RuntimeConsumerCapacity:
        return RuntimeConsumerCapacity(
            runtime_max_concurrency=self.gate.capacity,
            available_concurrency=self.gate.available,
        )

    def progress(self) -> list[ShardConsumptionProgress]:
        return [self._sessions[shard].progress() for shard in sorted(self._sessions)]
