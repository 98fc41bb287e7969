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
  a read comes back empty, or with fewer entries than asked (the stream is
  drained), does it block, asking for a small share of the tokens (at most
  half the budget over all shards), so idle shards never sit on tokens a busy
  shard needs, and a blocking read that comes back short proves the stream
  drained again (no empty read before the next block).  ``BLOCK`` is bounded
  by the remaining assignment lease, so no read outlives it.
* Before every read the session asks the member's state machine
  (``may_read``): a revoked or lost shard, or an expired lease, stops reads
  at once.  A revoke also cancels a blocking read in progress.
* A newly assigned shard first claims what the group still has pending
  (``XAUTOCLAIM`` with min-idle 0): the coordinator hands a shard over only
  after the previous owner reported it drained, was fenced, or let its lease
  expire, so nobody else is reading those entries any more.
* Acks are batched per shard: ``msg.ack()`` queues the id and one ``XACK``
  goes out in the same pipeline as the shard's next read (one round trip per
  entry at low load), or on its own before the loop waits for anything else,
  and always before the shard is reported revoked or drained (the final
  flush).  ``XACKDEL`` / ``MULTI XACK+XDEL`` and dead letters keep their own
  round trip.
* A failed entry goes through the listener's ``FailurePolicy``
  (``streamkit.consumer.failure`` decides, this module does the Redis side).  Attempts
  are Redis' delivery counter: a retry is an ``XCLAIM`` to ourselves, which
  adds exactly one, and entries claimed from a previous owner get their count
  from ``XPENDING``, so the count survives a handoff.  Ordered shards retry in
  place (later entries wait); unordered shards park the entry id in a bounded
  per-shard schedule and go on (a due retry rides along with the next read).
  A backoff never delays a revoke: the entry stays pending for the next owner.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import anyio
import redis.asyncio as redis_asyncio
from anyio.abc import TaskGroup, TaskStatus
from redis.exceptions import RedisError, ResponseError

from streamkit.backoff import jittered_backoff
from streamkit.connections import AsyncRedis, redis_address, send_command, send_commands
from streamkit.consumer.failure import Action, Decision, FailurePolicy, dead_letter_fields
from streamkit.consumer.handlers import BatchHandler, Handler
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.member import MemberStateMachine
from streamkit.consumer.message import Message, Settlement
from streamkit.consumer.tasks import run_concurrently
from streamkit.middleware import (
    BatchContext,
    Chain,
    ConsumeContext,
    ConsumeResult,
    Levels,
    Middleware,
    ReadContext,
)
from streamkit.protocol import RuntimeConsumerCapacity, ShardConsumptionProgress, ShardId
from streamkit.redis_health import RedisReachability, describe_error, is_unreachable_error
from streamkit.routing import stream_key

__all__ = [
    "BatchHandler",
    "FairGate",
    "Handler",
    "PollerOptions",
    "ReadObserver",
    "ShardPoller",
    "supports_xackdel",
]

log = logging.getLogger("streamkit.poller")

# A blocking read ends this long before the lease does, so the server-side
# BLOCK timeout plus network delay and event-loop lag still lands inside the
# lease (a read still running at lease end is abandoned: see _within_lease).
_LEASE_MARGIN_MS = 100
_MIN_BLOCK_MS = 5
_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 5.0
_END_OF_PEL = b"0-0"
_FINAL_FLUSH_S = 5.0
_DEFAULT_POLICY = FailurePolicy()
# A dead letter that could not be written is tried again after this long.
_DEAD_LETTER_RETRY_MS = 1_000


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
    #: The handler takes a list of up to ``batch_size`` entries of one shard.
    batch: bool = False
    #: What to do with a failed entry.
    policy: FailurePolicy = _DEFAULT_POLICY


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
        # Standalone Redis: dead letters (fields, entry id) written in the same
        # MULTI as the batch's XACK (_flush), so they cost no round trip of their own.
        self._dead_letters: list[tuple[dict[Any, Any], bytes]] = []
        # Our own pending entries to fetch again, in stream order (skipped when
        # the lease lapsed mid-batch): XCLAIM to ourselves before reading new ones.
        self._redeliver: list[bytes] = []
        # Unordered: failed entries waiting for their retry, (due ms, id, the
        # delivery count the XCLAIM will give it).  Only ids are kept (the
        # fields come back with the XCLAIM), at most max_in_flight of them:
        # when full, no new entries are read.
        self._retries: list[tuple[int, bytes, int]] = []
        self._retry_cap = poller.options.max_in_flight
        #: The failure policy halted the shard: no reads until it is assigned again.
        self.halted = False
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
        self._dead_letters.clear()
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
        # A nack is handled once the handler returned (ShardPoller.invoke):
        # it goes through the failure policy like an exception.

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
            # Acks ride along with the next read (_read_new), but never wait
            # behind anything else: before every wait they go out on their own.
            if self.halted:
                await self._flush()
                await self._interruptibly(anyio.sleep_forever())
                continue
            if not self.may_read():
                await self._flush()
                await self._interruptibly(poller.wait_for_change())
                continue
            if len(self._retries) >= self._retry_cap and self._until_due_ms() > 0:
                # Bounded memory: read nothing new until a parked retry is due.
                await self._flush()
                await self._interruptibly(anyio.sleep(self._until_due_ms() / 1000))
                continue
            want = (
                self._idle_share()
                if self._idle and not self._due_now()
                else poller.options.batch_size
            )
            granted = poller.gate.try_acquire(want)
            if not granted:
                await self._flush()
                granted = await self._interruptibly(poller.gate.acquire(want))
                if not granted:
                    continue
            error: BaseException | None = None
            try:
                if self.may_read():
                    try:
                        entries, counts = await self._read_within_lease(granted)
                    except (RedisError, OSError) as exc:
                        error = exc
                        if is_unreachable_error(exc):
                            poller.reachability.failed(monotonic_ms(), exc)
                    else:
                        failures = 0
                        poller.reachability.succeeded()
                        if entries:
                            await self._handle(entries, counts)
                            if self._ack_dels or self._dead_letters:
                                await self._flush()
            finally:
                poller.gate.release(granted)
            if error is not None:
                # Back off (no hot loop on NOGROUP or a Redis outage) without
                # holding tokens that other shards could use.
                failures += 1
                self._log_read_error(error, failures)
                await self._interruptibly(anyio.sleep(_backoff_s(failures)))

    def _idle_share(self) -> int:
        """Tokens an idle shard's blocking read asks for.

        More than one, so that a blocking read coming back short (fewer
        entries than asked) proves the stream drained and the next read can
        block again at once, with no empty non-blocking read in between.  At
        most half the member's budget is spread over its idle shards, so a
        busy shard always finds tokens.
        """
        poller = self._poller
        share = poller.gate.capacity // (2 * max(1, len(poller._sessions)))
        return max(1, min(poller.options.batch_size, share))

    async def _read_within_lease(
        self, count: int
    ) -> tuple[list[tuple[bytes, Any]], dict[bytes, int]]:
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
            return [], {}

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

    async def _read_batch(self, count: int) -> tuple[list[tuple[bytes, Any]], dict[bytes, int]]:
        """The next entries: claimed leftovers first, then redeliveries, then
        due retries (topped up with new entries), then new ones.  Also the
        delivery counts of the entries that were claimed (the others: 1)."""
        if self._claiming or self._redeliver or self._due_now():
            await self._flush()  # rare paths: the acks go out on their own
        if self._claiming:
            entries, self._claiming = await self._claim(count)
            return entries, await self._delivery_counts(entries)
        if self._redeliver:
            ids, self._redeliver = self._redeliver[:count], self._redeliver[count:]
            try:
                entries = await self._xclaim(ids)
            except BaseException:
                self._redeliver[:0] = ids
                raise
            return entries, await self._delivery_counts(entries)
        due = self._take_due(count)
        if due:
            try:
                entries, fresh = await self._retry_and_read(due, count - len(due))
            except BaseException:
                for entry_id, delivery in due:
                    heapq.heappush(self._retries, (0, entry_id, delivery))
                raise
            # XCLAIM adds exactly one to the counter read at the last delivery.
            known = dict(due)
            counts = {entry_id: known[entry_id] for entry_id, _ in entries}
            self._idle = not fresh
            return entries + fresh, counts
        entries = await self._read_new(count, block=self._idle)
        # A read that came back short (blocking or not) found the stream
        # drained: block at once next time instead of sending a read certain
        # to be empty (at low load that read was one of three commands per
        # message).  A full one may have left a backlog: read on without BLOCK.
        self._idle = len(entries) < count
        return entries, {}

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
                await self._flush()
                await self._interruptibly(poller.wait_for_change())
                return []
            if self._retries:  # wake up for the next parked retry
                block_ms = max(_MIN_BLOCK_MS, min(block_ms, self._until_due_ms()))
        if self._ack_dels or self._dead_letters:
            await self._flush()  # rare: deletes and dead letters keep their own round trip
        # The acks of the last batch go out in the same round trip as this
        # read (one pipeline, one key: one node in a cluster too), ahead of it.
        acks, self._acks = self._acks, []
        reply: Any
        try:
            with self._observed_read() as tally:
                read = self._xreadgroup(count, block_ms, acks)
                if block_ms is None:
                    reply = await self._within_lease(read)
                else:
                    reply = await self._interruptibly(self._within_lease(read))
                if acks:
                    reply = self._folded_reply(acks, reply)
                    acks = []  # booked or queued again
                    if isinstance(reply, Exception):
                        raise reply
                entries = _entries_of(reply)
                tally.count = len(entries)
        except BaseException:
            # Cancelled, cut by the lease or failed: whether the XACK ran is
            # unknown, so it is sent again (an XACK of an acked id is a no-op)
            # with the next read or the final flush, before the shard is
            # reported revoked or drained.
            self._requeue_acks(acks)
            raise
        self.pending_count += tally.count
        return entries

    def _xreadgroup(self, count: int, block_ms: int | None, acks: list[bytes]) -> Awaitable[Any]:
        redis = self._poller.redis
        if not isinstance(redis, redis_asyncio.RedisCluster):
            return self._lean_xreadgroup(redis, count, block_ms, acks)
        if not acks:
            return redis.xreadgroup(
                self.consumer_group,
                self.member_id,
                {self.stream_key: ">"},
                count=count,
                block=block_ms,
            )
        pipe = redis.pipeline(transaction=False)
        pipe.xack(self.stream_key, self.consumer_group, *acks)
        pipe.xreadgroup(
            self.consumer_group, self.member_id, {self.stream_key: ">"}, count=count, block=block_ms
        )
        return pipe.execute(raise_on_error=False)

    async def _lean_xreadgroup(
        self, redis: AsyncRedis, count: int, block_ms: int | None, acks: list[bytes]
    ) -> Any:
        """``_xreadgroup`` over streamkit's lean pipeline (standalone Redis): the
        same replies, without redis-py's timer per reply and per-command work
        on the hottest round trip of a consumer."""
        read: tuple[Any, ...] = ("XREADGROUP", "GROUP", self.consumer_group, self.member_id,
                                 "COUNT", count)  # fmt: skip
        if block_ms is not None:
            read += ("BLOCK", block_ms)
        read += ("STREAMS", self.stream_key, ">")
        if not acks:
            return _parsed_read(await send_command(redis, *read))
        ack = ("XACK", self.stream_key, self.consumer_group, *acks)
        ack_reply, read_reply = await send_commands(redis, [ack, read])
        if not isinstance(read_reply, Exception):
            read_reply = _parsed_read(read_reply)
        return [ack_reply, read_reply]

    def _folded_reply(self, acks: list[bytes], replies: Any) -> Any:
        """The read's reply (or error) out of an ``[XACK, XREADGROUP]`` pipeline;
        books the acks, or queues them again if the XACK failed."""
        if replies is None:  # halted while blocking: the XACK's fate is unknown
            self._requeue_acks(acks)
            return None
        ack_reply, read_reply = replies
        if isinstance(ack_reply, Exception):
            log.warning(
                "%s: ack of %s failed, will retry: %s",
                self.member_id,
                self.stream_key,
                describe_error(ack_reply),
            )
            self._requeue_acks(acks)
        else:
            self._acked(acks, [])
        return read_reply

    def _requeue_acks(self, acks: list[bytes]) -> None:
        if acks and not self.aborted:
            self._acks[:0] = acks

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

    async def _xclaim(self, ids: list[bytes]) -> list[tuple[bytes, Any]]:
        """Fetch our own pending entries again (XCLAIM to ourselves, min-idle 0).

        Redis adds one to each entry's delivery counter: that is the attempt
        count a retry is known by, on this member or the next owner.
        """
        poller = self._poller
        reply: Any
        with self._observed_read() as tally:
            reply = await self._within_lease(
                poller.redis.xclaim(
                    self.stream_key, self.consumer_group, self.member_id, 0, list[Any](ids)
                )
            )
            entries: list[tuple[bytes, Any]] = [e for e in reply if e[1] is not None]
            tally.count = len(entries)
        return entries

    async def _retry_and_read(
        self, due: list[tuple[bytes, int]], more: int
    ) -> tuple[list[tuple[bytes, Any]], list[tuple[bytes, Any]]]:
        """XCLAIM the due retries and read up to ``more`` new entries, in one
        round trip (one key, so one node in a cluster too)."""
        poller = self._poller
        pipe = poller.redis.pipeline(transaction=False)
        pipe.xclaim(self.stream_key, self.consumer_group, self.member_id, 0, [i for i, _ in due])
        if more > 0:
            pipe.xreadgroup(self.consumer_group, self.member_id, {self.stream_key: ">"}, count=more)
        with self._observed_read() as tally:
            replies = await self._within_lease(pipe.execute())
            claimed: list[tuple[bytes, Any]] = [e for e in replies[0] if e[1] is not None]
            fresh = _entries_of(replies[1]) if more > 0 else []
            tally.count = len(claimed) + len(fresh)
        self.pending_count += len(fresh)
        return claimed, fresh

    async def _delivery_counts(self, entries: list[tuple[bytes, Any]]) -> dict[bytes, int]:
        """Redis' delivery counter of claimed entries (``XPENDING`` per id, one round trip).

        Claims are rare (a handoff, a retry), so the extra round trip stays off
        the hot path.  If it fails the entries are handled anyway, counted as
        a second delivery, the least a claimed entry can have.
        """
        if not entries:
            return {}
        pipe = self._poller.redis.pipeline(transaction=False)
        for entry_id, _ in entries:
            pipe.xpending_range(self.stream_key, self.consumer_group, entry_id, entry_id, 1)
        try:
            replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("%s: no delivery counts for %s: %r", self.member_id, self.stream_key, exc)
            return {entry_id: 2 for entry_id, _ in entries}
        counts: dict[bytes, int] = {}
        for (entry_id, _), reply in zip(entries, replies, strict=True):
            # A claimed entry was delivered at least once before this claim.
            counts[entry_id] = int(reply[0]["times_delivered"]) if reply else 2
        return counts

    # -- parked retries (unordered) ----------------------------------------------

    def _park(self, message: Message, delay_ms: int) -> None:
        # The next read's BLOCK is cut to the first due retry (_read_new).
        due = monotonic_ms() + delay_ms
        heapq.heappush(self._retries, (due, message.raw_id, message.delivery_count + 1))

    def _until_due_ms(self) -> int:
        if not self._retries:
            return 1 << 30
        return max(0, self._retries[0][0] - monotonic_ms())

    def _due_now(self) -> bool:
        return bool(self._retries) and self._retries[0][0] <= monotonic_ms()

    def _take_due(self, count: int) -> list[tuple[bytes, int]]:
        """Up to ``count`` due retries, in stream order: (id, delivery count)."""
        now = monotonic_ms()
        due: list[tuple[bytes, int]] = []
        while self._retries and self._retries[0][0] <= now and len(due) < count:
            _, entry_id, delivery = heapq.heappop(self._retries)
            due.append((entry_id, delivery))
        due.sort(key=lambda item: _id_key(item[0]))
        return due

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

    async def _handle(self, entries: list[tuple[bytes, Any]], counts: dict[bytes, int]) -> None:
        shard = self.shard
        self.last_delivered_id = _later(self.last_delivered_id, entries[-1][0])
        if counts:
            messages = [
                Message(
                    self,
                    shard,
                    entry_id,
                    fields,
                    redelivered=entry_id in counts,
                    delivery_count=counts.get(entry_id, 1),
                )
                for entry_id, fields in entries
            ]
        else:  # first deliveries, the common case: the defaults hold
            messages = [Message(self, shard, entry_id, fields) for entry_id, fields in entries]
        self.in_flight = len(messages)
        poller = self._poller
        try:
            levels = poller.begin_read()
            if not levels:
                await self._handle_read(messages, None)
            else:
                ctx = poller.read_context(messages)
                await Chain.run(levels, ctx, partial(self._handle_read, messages, []))
        finally:
            self.in_flight = 0

    async def _handle_read(
        self, messages: list[Message], results: list[ConsumeResult] | None
    ) -> list[ConsumeResult]:
        """Handle one read; ``results`` (for ``consume_read``) collects each
        handler call's result, None when nobody looks."""
        if self._poller.options.ordered:
            await self._handle_ordered(messages, results)
        else:
            await self._handle_unordered(messages, results)
        return results if results is not None else []

    async def _handle_ordered(
        self, messages: list[Message], results: list[ConsumeResult] | None
    ) -> None:
        """One entry (or one batch) at a time; a failed one is retried in place
        before anything after it starts."""
        poller = self._poller
        batch = poller.options.batch
        step = len(messages) if batch else 1
        for index in range(0, len(messages), step):
            # Start nothing once the shard may not be read: the rest stays
            # pending, for whoever owns the shard next or, if only the lease
            # lapsed, for us once it is renewed.
            if not self.may_read():
                if not self.stopping:
                    self._redeliver.extend(m.raw_id for m in messages[index:])
                return
            decisions: list[Decision | None]
            if batch:
                chunk = messages
                decisions = [r.decision for r in await poller.invoke_batch(chunk)]
            else:
                result = await poller.invoke(messages[index])
                if results is not None:
                    results.append(result)
                if result.decision is None:  # the common case, kept short
                    self.in_flight -= 1
                    continue
                chunk, decisions = [messages[index]], [result.decision]
            left = await self._run_in_place(chunk, decisions, results)
            if left:
                if not self.stopping and not self.halted:
                    self._redeliver.extend(left)
                    self._redeliver.extend(m.raw_id for m in messages[index + step :])
                return
            self.in_flight -= len(chunk)

    async def _run_in_place(
        self,
        chunk: list[Message],
        decisions: list[Decision | None],
        results: list[ConsumeResult] | None,
    ) -> list[bytes]:
        """Finish ``chunk`` (handled once, with these outcomes), retrying failures in place.

        Returns the ids (in stream order) of the entries it had to leave
        pending: the shard was halted or stopped, the lease lapsed during a
        backoff, or Redis failed.
        """
        poller = self._poller
        while True:
            retry: list[Message] = []
            delay_ms = 0
            stuck = False
            for message, decision in zip(chunk, decisions, strict=True):
                if decision is None:
                    continue
                if decision.action is Action.RETRY:
                    delay_ms = max(delay_ms, decision.delay_ms)
                elif decision.action is Action.HALT:
                    self._halt_shard(message, decision)
                    stuck = True
                elif await self._dead_letter(message, decision):
                    continue
                else:
                    stuck = True
                retry.append(message)
            if not retry:
                return []
            left = [m.raw_id for m in retry]
            if stuck:
                return left
            # Acks of the entries before this one need not wait for its retries.
            await self._flush()
            # halt() interrupts the backoff: a revoke never waits for it, and the
            # entry stays pending for the next owner, which goes on counting.
            await self._interruptibly(anyio.sleep(delay_ms / 1000))
            if not self.may_read():
                return left
            try:
                entries = await self._xclaim(left)
            except (RedisError, OSError, _LeaseCut) as exc:
                log.warning("%s: retry of %s failed: %r", self.member_id, self.stream_key, exc)
                return left
            # XCLAIM adds exactly one to the counter read at the last delivery.
            before = {m.raw_id: m.delivery_count for m in retry}
            chunk = [
                Message(
                    self,
                    self.shard,
                    entry_id,
                    fields,
                    redelivered=True,
                    delivery_count=before[entry_id] + 1,
                )
                for entry_id, fields in entries
            ]
            if not chunk:
                return []  # gone meanwhile (acked elsewhere, deleted, trimmed)
            again = await poller.invoke_all(chunk)
            if results is not None:
                results.extend(again)
            decisions = [r.decision for r in again]

    async def _handle_unordered(
        self, messages: list[Message], results: list[ConsumeResult] | None
    ) -> None:
        """Everything at once; a failed entry is parked, the others go on."""
        poller = self._poller
        if poller.options.batch:
            for message, result in zip(messages, await poller.invoke_batch(messages), strict=True):
                if result.decision is not None:
                    await self._apply_unordered(message, result.decision)
            return

        async def one(message: Message) -> None:
            result = await poller.invoke(message)
            if results is not None:
                results.append(result)
            if result.decision is not None:
                await self._apply_unordered(message, result.decision)

        # Not an anyio task group: starting a task in one costs more than
        # handling a small entry does (see streamkit.consumer.tasks).
        await run_concurrently([one(message) for message in messages])

    async def _apply_unordered(self, message: Message, decision: Decision) -> None:
        if decision.action is Action.RETRY:
            self._park(message, decision.delay_ms)
        elif decision.action is Action.HALT:
            self._halt_shard(message, decision)
        elif not await self._dead_letter(message, decision):
            self._park(message, _DEAD_LETTER_RETRY_MS)

    def _halt_shard(self, message: Message, decision: Decision) -> None:
        """``on_exhausted="halt"``: keep the entry pending and stop reading the shard."""
        if not self.halted:
            log.error(
                "%s: HALTED shard %s: entry %s failed %d attempt(s) (last: %s); it stays "
                "pending and the shard is not read until it is assigned again",
                self.member_id,
                self.stream_key,
                message.id,
                message.delivery_count,
                decision.error,
            )
        self.halted = True
        self._poller.halted[self.shard] = message.id

    async def _dead_letter(self, message: Message, decision: Decision) -> bool:
        """Write the entry to the dead-letter stream, then ack it; False if Redis failed.

        Standalone Redis: the ``XADD`` goes out with the batch's ``XACK``, in
        one ``MULTI`` (``_flush``).  In a cluster the two keys usually live in
        different slots, so the ``XADD`` goes first and the ``XACK`` joins the
        batch's acks: a crash in between leaves the entry pending and it is
        dead-lettered again (a duplicate dead letter, never a lost entry).
        """
        if self.aborted:
            return True  # lost: another member may own the shard now
        poller = self._poller
        policy = poller.options.policy
        fields = dead_letter_fields(
            message.raw_fields,
            stream_key=self.stream_key,
            entry_id=message.id,
            consumer_group=self.consumer_group,
            attempts=message.delivery_count,
            error=decision.error,
        )
        key = poller.dead_letter_key
        try:
            if poller.cluster:
                await poller.redis.xadd(
                    key, fields, maxlen=policy.dead_letter_maxlen, approximate=True
                )
                self._acks.append(message.raw_id)
            else:
                self._dead_letters.append((fields, message.raw_id))
        except (RedisError, OSError) as exc:
            log.warning(
                "%s: could not dead-letter %s entry %s to %s (%r); it stays pending",
                self.member_id,
                self.stream_key,
                message.id,
                key,
                exc,
            )
            return False
        poller.dead_lettered += 1
        log.error(
            "%s: dead-lettering %s entry %s to %s after %d attempt(s): %s",
            self.member_id,
            self.stream_key,
            message.id,
            key,
            message.delivery_count,
            decision.error,
        )
        return True

    async def _flush(self, *, final: bool = False) -> None:
        acks, dels, letters = self._acks, self._ack_dels, self._dead_letters
        if not acks and not dels and not letters:
            return
        self._acks, self._ack_dels, self._dead_letters = [], [], []
        redis = self._poller.redis
        attempts = 3 if final else 1
        for attempt in range(1, attempts + 1):
            try:
                if letters:
                    # Standalone only: dead letters and acks in one MULTI, so
                    # an entry is never acked without its dead letter.
                    await self._dead_letter_and_ack(acks, dels, letters).execute()
                elif not dels:
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
                    self._dead_letters[:0] = letters
                return
            break
        self._poller.reachability.succeeded()
        self._acked(acks, dels)
        # Apart: each list is in stream order by itself, not the two joined.
        self._acked([entry_id for _, entry_id in letters], [])

    def _acked(self, acks: list[bytes], dels: list[bytes]) -> None:
        """Book entries Redis confirmed acked (progress reports)."""
        self.pending_count = max(0, self.pending_count - len(acks) - len(dels))
        if acks:
            # Ordered: acks come in stream order (a flush precedes every read
            # of older entries), so the last is the latest; parsing every id
            # was a twentieth of a handled entry's cost.  This is progress
            # reporting only: a handler that acks an older entry late leaves
            # it behind for one batch.
            latest = acks[-1] if self._poller.options.ordered else max(acks, key=_id_key)
            self.last_acked_id = _later(self.last_acked_id, latest)
        if dels:
            self.last_acked_id = _later(self.last_acked_id, dels[-1])

    def _dead_letter_and_ack(
        self, acks: list[bytes], dels: list[bytes], letters: list[tuple[dict[Any, Any], bytes]]
    ) -> Any:
        """A MULTI pipeline: the dead letters' XADDs, then every XACK (and XDEL)."""
        poller = self._poller
        policy = poller.options.policy
        pipe = poller.redis.pipeline(transaction=True)
        for fields, _ in letters:
            pipe.xadd(
                poller.dead_letter_key, fields, maxlen=policy.dead_letter_maxlen, approximate=True
            )
        pipe.xack(self.stream_key, self.consumer_group, *acks, *[i for _, i in letters])
        if dels:
            if poller.xackdel:
                pipe.execute_command(
                    "XACKDEL", self.stream_key, self.consumer_group, "IDS", len(dels), *dels
                )
            else:
                pipe.xack(self.stream_key, self.consumer_group, *dels)
                pipe.xdel(self.stream_key, *dels)
        return pipe

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


def _parsed_read(raw: Any) -> Any:
    """A raw one-stream XREADGROUP reply in redis-py's parsed RESP2 shape
    (``[[stream, [(id, fields dict), ...]]]``; None: nothing arrived)."""
    if not raw:
        return None
    stream, entries = next(iter(raw.items())) if isinstance(raw, dict) else raw[0]
    parsed: list[tuple[bytes, dict[bytes, bytes] | None]] = []
    for entry_id, flat in entries:
        if flat is None:  # a pending entry trimmed away
            parsed.append((entry_id, None))
        else:
            pairs = iter(flat)
            parsed.append((entry_id, dict(zip(pairs, pairs, strict=True))))
    return [[stream, parsed]]


def _entries_of(reply: Any) -> list[tuple[bytes, Any]]:
    """The entries of a one-stream XREADGROUP reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        entries: list[tuple[bytes, Any]] = next(iter(reply.values()))[0]
        return entries
    entries = reply[0][1]
    return entries


def _next_step(decision: Decision) -> str:
    if decision.action is Action.RETRY:
        return f"retrying in {decision.delay_ms} ms"
    if decision.action is Action.HALT:
        return "attempts exhausted, halting the shard"
    return "attempts exhausted, dead-lettering it"


def _backoff_s(failures: int) -> float:
    return jittered_backoff(failures, _BACKOFF_MIN_S, _BACKOFF_MAX_S, random.random())


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
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
        options: PollerOptions,
        xackdel: bool = False,
        observer: ReadObserver | None = None,
        middlewares: Sequence[Middleware] = (),
    ) -> None:
        if (handler is None) == (batch_handler is None) or (batch_handler is None) == (
            options.batch
        ):
            raise ValueError("give a handler, or a batch_handler with options.batch")
        self.machine = machine
        self.redis = redis
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group
        self.member_id = machine.member_id
        self.options = options
        self.xackdel = xackdel
        self.observer = observer
        self.middlewares = tuple(middlewares)
        # Built once: ``invoke`` runs per entry (see ``Chain``).
        self._consume_chain: Chain[ConsumeContext, ConsumeResult] = Chain(
            self.middlewares, "consume"
        )
        self._batch_chain: Chain[BatchContext, list[ConsumeResult]] = Chain(
            self.middlewares, "consume_batch"
        )
        # consume_read wraps the reads of a per-entry handler only (a batch
        # handler's read is one consume_batch call).
        self._read_chain: Chain[ReadContext, list[ConsumeResult]] = Chain(
            self.middlewares if handler is not None else (), "consume_read"
        )
        # Which per-entry levels are active, taken once per read (begin_read).
        self._consume_levels: Levels = self._consume_chain.active_levels()
        self.gate = FairGate(options.max_in_flight)
        #: Outcomes of reads and acks: the member gives its shards back when
        #: Redis stays unreachable (see ``streamkit.redis_health``).
        self.reachability = RedisReachability()
        self.redis_address = redis_address(redis)
        self._handler = handler
        self._batch_handler = batch_handler
        self.cluster = isinstance(redis, redis_asyncio.RedisCluster)
        self.dead_letter_key = options.policy.dead_letter_key(stream_prefix, consumer_group)
        #: shard -> the entry that halted it (``on_exhausted="halt"``).
        self.halted: dict[int, str] = {}
        #: Entries written to the dead-letter stream (metrics).
        self.dead_lettered = 0
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
            self.halted.pop(shard, None)
            if session is not None:
                session.abort()

    def abort_all(self) -> None:
        self.abort(frozenset(self._sessions))

    def _session_finished(self, session: ShardSession) -> None:
        if self._sessions.get(session.shard) is session:
            del self._sessions[session.shard]
            self.halted.pop(session.shard, None)

    # -- coordination with the heartbeat loop ------------------------------------------

    def notify(self) -> None:
        """The member's state changed (a heartbeat answered): re-check leases."""
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for_change(self) -> None:
        await self._changed.wait()

    # -- handler -----------------------------------------------------------------------

    def begin_read(self) -> Levels:
        """A read is about to be handled: take the active middleware levels.

        Returns the active ``consume_read`` levels, and keeps the active
        ``consume`` levels that ``invoke`` uses until the next read: ``active``
        is read once per read, not per entry.
        """
        self._consume_levels = self._consume_chain.active_levels()
        return self._read_chain.active_levels()

    def read_context(self, messages: list[Message]) -> ReadContext:
        return ReadContext(messages, self.stream_prefix, self.consumer_group, self.member_id)

    async def invoke(self, message: Message) -> ConsumeResult:
        """Run the handler on one message; the result's ``decision`` is None
        when done, else what the policy says.

        The middlewares (``streamkit.middleware``) wrap the handler and the
        policy's decision together, so they see the outcome.
        """
        levels = self._consume_levels
        if not levels:
            return await self._run_one(message)
        ctx = ConsumeContext(message, self.stream_prefix, self.consumer_group, self.member_id)
        return await Chain.run(levels, ctx, partial(self._run_one, message))

    async def invoke_batch(self, messages: list[Message]) -> list[ConsumeResult]:
        """Run the batch handler; per message, a result whose ``decision`` is
        None when done, else the policy's decision.

        If it raises, every message it did not settle failed with that error.
        """
        if not self._batch_chain:
            return await self._run_batch(messages)
        ctx = BatchContext(messages, self.stream_prefix, self.consumer_group, self.member_id)
        return await self._batch_chain(ctx, partial(self._run_batch, messages))

    async def _run_one(self, message: Message) -> ConsumeResult:
        assert self._handler is not None
        started = time.perf_counter()
        try:
            await self._handler(message)
        except Exception as exc:
            elapsed = time.perf_counter() - started
            return ConsumeResult(self._failed(message, exc), exc, elapsed, message)
        elapsed = time.perf_counter() - started
        settled = message.settled
        if settled is None:
            if self.options.auto_ack:
                message.ack()
            return ConsumeResult(None, None, elapsed, message)
        decision = self._failed(message, None) if settled is Settlement.NACK else None
        return ConsumeResult(decision, None, elapsed, message)

    async def _run_batch(self, messages: list[Message]) -> list[ConsumeResult]:
        assert self._batch_handler is not None
        started = time.perf_counter()
        try:
            errors = await self._batch_handler(messages)
        except Exception as exc:
            elapsed = time.perf_counter() - started
            return [
                ConsumeResult(self._failed(m, exc), exc, elapsed, m)
                if m.settled is None
                else ConsumeResult(self._returned(m), None, elapsed, m)
                for m in messages
            ]
        elapsed = time.perf_counter() - started
        return [
            ConsumeResult(self._failed(m, errors[i]), errors[i], elapsed, m)
            if i in errors
            else ConsumeResult(self._returned(m), None, elapsed, m)
            for i, m in enumerate(messages)
        ]

    async def invoke_all(self, messages: list[Message]) -> list[ConsumeResult]:
        if self._batch_handler is not None:
            return await self.invoke_batch(messages)
        return [await self.invoke(m) for m in messages]

    def _returned(self, message: Message) -> Decision | None:
        if message.settled is Settlement.NACK:
            return self._failed(message, None)
        if self.options.auto_ack and message.settled is None:
            message.ack()
        return None

    def _failed(self, message: Message, error: BaseException | None) -> Decision:
        decision = self.options.policy.decide(
            message.delivery_count, error, delay_ms=message.nack_delay_ms, rand=random.random()
        )
        if error is not None:
            log.warning(
                "handler failed for %s entry %s (group %s, member %s, attempt %d): %s",
                message.stream_key,
                message.id,
                self.consumer_group,
                self.member_id,
                message.delivery_count,
                _next_step(decision),
                exc_info=error,
            )
        return decision

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
