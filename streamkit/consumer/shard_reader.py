"""``ShardReader``: the read loop of one shard, for one assignment of it.

One reader per owned shard, never more: a multi-key ``XREADGROUP`` would fail
with CROSSSLOT in Redis Cluster, and one loop per shard keeps each shard's
entries in order.  What the reader may ask of its member is the narrow
:class:`~streamkit.consumer.reader_host.ReaderHost` (the in-flight budget,
the lease, the dispatcher, where to report), and Redis is behind its
:class:`~streamkit.consumer.shard_io.ShardIO`.

How it reads, claims, acks and gives up: docs/architecture.md ("The poller").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from redis.exceptions import RedisError

from streamkit.consumer.acks import AckQueue, backoff_s
from streamkit.consumer.idempotence import Effects, Idempotence
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.message import Message, Settlement
from streamkit.consumer.reader_host import ReaderHost
from streamkit.consumer.retry_schedule import RetrySchedule
from streamkit.consumer.shard_io import END_OF_PEL, Entry, LeaseCut, ShardIO, later_id
from streamkit.protocol import ShardConsumptionProgress, ShardId
from streamkit.redis_health import is_unreachable_error
from streamkit.results import Decision

__all__ = ["ShardReader"]

log = logging.getLogger("streamkit.poller")

# A blocking read ends this long before the lease does, so the server-side
# BLOCK timeout plus network delay and event-loop lag still lands inside the
# lease (a read still running at lease end is abandoned: see _within_lease).
_LEASE_MARGIN_MS = 100
_MIN_BLOCK_MS = 5
_FINAL_FLUSH_S = 5.0
# How long a reader waiting for tokens keeps its acks for the next read.
_ACK_PATIENCE_S = 0.02

T = TypeVar("T")
#: Entries read, claimed ones' delivery counts, their markers if the read answered.
_Batch = tuple[list[Entry], dict[bytes, int], list[bool] | None]


class ShardReader:
    """The read loop of one shard for one assignment of it."""

    def __init__(self, host: ReaderHost, io: ShardIO, shard: int) -> None:
        self._host = host
        self._io = io
        self._lease = host.lease
        self.shard = shard
        self.stream_key = io.stream_key
        self.consumer_group = io.consumer_group
        self.member_id = io.member_id
        self.stopping = False  # no new reads (revoked, stopping, lost)
        self.aborted = False  # lost: no acks, no further handlers
        self.in_flight = 0
        self.finished = anyio.Event()
        self.last_delivered_id: bytes | None = None
        #: ``idempotent=``: markers, fencing and staged effects (None: off).
        self.idempotence: Idempotence | None = host.options.idempotence
        self._acks = AckQueue(
            io,
            host.reachability,
            ordered=host.options.ordered,
            idempotence=self.idempotence,
            counts=host.commit_counts,
        )
        # Our own pending entries to fetch again, in stream order (skipped when
        # the lease lapsed mid-batch): XCLAIM to ourselves before reading new ones.
        self._redeliver: list[bytes] = []
        # Unordered: failed entries waiting for their retry.
        self._retries = RetrySchedule(host.options.max_in_flight)
        #: The failure policy halted the shard: no reads until it is assigned again.
        self.halted = False
        self._claiming = host.options.claim_pending
        self._claim_cursor = END_OF_PEL
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
        self._acks.drop()
        self.halt()

    def settle(self, message_id: bytes, how: Settlement) -> None:
        if self.aborted or self.finished.is_set():
            # Lost: another member may own the shard now, so acking could
            # interfere with its reads.  Finished: settled after the handler returned.
            log.debug(
                "ignoring %s of %s %r: shard no longer held", how.value, self.stream_key, message_id
            )
            return
        if how is Settlement.ACK:
            self._acks.acks.append(message_id)
        elif how is Settlement.ACK_DEL:
            self._acks.dels.append(message_id)
        # A nack goes through the failure policy once the handler returned (the Invoker).

    def commit(self, message: Message, how: Settlement) -> None:
        """An idempotent listener's ack: marker + staged effects + ack, queued."""
        if self.aborted or self.finished.is_set():
            log.debug("ignoring %s of %s: shard no longer held", how.value, self.stream_key)
            return
        self._acks.commit(message, how)

    def effects(self) -> Effects:
        return Effects(self.stream_key, cluster=self._io.cluster)

    def may_read(self) -> bool:
        return not self.stopping and self._lease.may_read(self.shard, monotonic_ms())

    # -- the loop --------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            # Shielded: a forced stop cancels handlers, but acks of the ones
            # that finished are still worth sending (bounded: Redis may be gone).
            with anyio.move_on_after(_FINAL_FLUSH_S, shield=True):
                if not self.aborted:
                    await self._acks.flush(final=True)
            self.finished.set()
            self._host.reader_finished(self)

    async def _loop(self) -> None:
        host = self._host
        gate, options, retries = host.gate, host.options, self._retries
        failures = 0
        while not self.stopping:
            # Acks ride along with the next read (_read_new), but never wait
            # behind anything else: before every wait they go out on their own.
            if self.halted:
                await self._acks.flush()
                await self.interruptibly(anyio.sleep_forever())
                continue
            if not self.may_read():
                await self._acks.flush()
                await self.interruptibly(host.wait_for_change())
                continue
            if self.idempotence is not None and self._acks.token is None:
                # Fence earlier readers of the shard before handling anything.
                try:
                    self._acks.token = await self._within_lease(self._io.take_fence())
                except (RedisError, OSError, LeaseCut) as exc:
                    failures += 1
                    self._io.log_read_error(exc, failures, self._host.redis_address)
                    await self.interruptibly(anyio.sleep(backoff_s(failures)))
                continue
            if retries.full and retries.until_due_ms(monotonic_ms()) > 0:
                # Bounded memory: read nothing new until a parked retry is due.
                await self._acks.flush()
                await self.interruptibly(anyio.sleep(retries.until_due_ms(monotonic_ms()) / 1000))
                continue
            want = (
                host.idle_share()
                if self._idle and not retries.due(monotonic_ms())
                else options.batch_size
            )
            granted = gate.try_acquire(want)
            if not granted:
                # The queued acks ride with the next read if tokens come back
                # soon (one round trip per batch, as a plain read-ack loop);
                # a longer wait sends them first, so that nothing waits
                # unacked behind other shards' handlers.
                granted = await self.interruptibly(
                    gate.acquire(want, meanwhile=self._flush_waiting, after_s=_ACK_PATIENCE_S)
                )
                if not granted:
                    continue
            error: BaseException | None = None
            try:
                if self.may_read():
                    try:
                        entries, counts, marks = await self._read_within_lease(granted)
                    except (RedisError, OSError) as exc:
                        error = exc
                        if is_unreachable_error(exc):
                            host.reachability.failed(monotonic_ms(), exc)
                    else:
                        failures = 0
                        host.reachability.succeeded()
                        if entries:
                            self.last_delivered_id = later_id(
                                self.last_delivered_id, entries[-1][0]
                            )
                            if self.idempotence is not None:
                                entries = await self._acks.skip_marked(
                                    entries, self._within_lease, marks
                                )
                            await host.dispatcher.handle(self, entries, counts)
                            if self._acks.rare:
                                await self._acks.flush()
            finally:
                gate.release(granted)
            if error is not None:
                # Back off (no hot loop on NOGROUP or a Redis outage) without
                # holding tokens that other shards could use.
                failures += 1
                self._io.log_read_error(error, failures, self._host.redis_address)
                await self.interruptibly(anyio.sleep(backoff_s(failures)))

    async def _flush_waiting(self) -> None:
        """The acks of a reader that waits long for tokens.  A halt does not cut
        the round trip short (a dead letter sent again would be a duplicate);
        bounded as the final flush is."""
        with anyio.move_on_after(_FINAL_FLUSH_S, shield=True):
            await self._acks.flush()

    async def _read_within_lease(self, count: int) -> _Batch:
        """``_read_batch``, but no Redis command of it outlives the assignment lease."""
        try:
            return await self._read_batch(count)
        except LeaseCut:
            log.warning(
                "%s: Redis did not answer a read of %s before the assignment lease ended; "
                "abandoned it",
                self.member_id,
                self.stream_key,
            )
            # The command may still have run in Redis: whatever it delivered
            # is pending for us, so fetch pending entries again before new
            # ones once the lease is renewed (only while the shard is ours).
            if self._host.options.claim_pending:
                self._claiming = True
                self._claim_cursor = END_OF_PEL
            return [], {}, None

    async def _within_lease(self, command: Awaitable[T]) -> T:
        """Await one Redis command; raise ``LeaseCut`` if the lease ends first.

        A Redis that stops answering (paused, black-holed) must not keep a
        read going past the lease: by then the coordinator may hand the shard
        to another member.  Cancelling drops the connection, so a reply that
        arrives later is never handled.
        """
        remaining_ms = self._lease.lease_remaining_ms(monotonic_ms())
        with anyio.move_on_after(remaining_ms / 1000):
            return await command
        raise LeaseCut

    async def _read_batch(self, count: int) -> _Batch:
        """The next entries: claimed leftovers first, then redeliveries, then
        due retries (topped up with new entries), then new ones.  Also the
        delivery counts of the entries that were claimed (the others: 1), and
        whether each has a marker when the read answered it (idempotent)."""
        retries = self._retries
        if self._claiming or self._redeliver or retries.due(monotonic_ms()):
            await self._acks.flush()  # rare paths: the acks go out on their own
        if self._claiming:
            entries = await self._claim(count)
            return entries, await self._delivery_counts(entries), None
        if self._redeliver:
            ids, self._redeliver = self._redeliver[:count], self._redeliver[count:]
            try:
                entries = await self.reclaim(ids)
            except BaseException:
                self._redeliver[:0] = ids
                raise
            return entries, await self._delivery_counts(entries), None
        due = retries.take_due(count, monotonic_ms())
        if due:
            try:
                with self._observed_read() as tally:
                    claimed, fresh = await self._within_lease(
                        self._io.claim_and_read([i for i, _ in due], count - len(due))
                    )
                    tally.count = len(claimed) + len(fresh)
            except BaseException:
                retries.put_back(due)
                raise
            self._acks.pending_count += len(fresh)
            # XCLAIM adds exactly one to the counter read at the last delivery.
            known = dict(due)
            counts = {entry_id: known[entry_id] for entry_id, _ in claimed}
            self._idle = not fresh
            return claimed + fresh, counts, None
        entries, marks = await self._read_new(count, block=self._idle)
        # A read that came back short (blocking or not) found the stream
        # drained: block at once next time instead of sending a read certain
        # to be empty (at low load that read was one of three commands per
        # message).  A full one may have left a backlog: read on without BLOCK.
        self._idle = len(entries) < count
        return entries, {}, marks

    async def interruptibly(self, awaitable: Awaitable[Any]) -> Any:
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

    async def _read_new(self, count: int, *, block: bool) -> tuple[list[Entry], list[bool] | None]:
        host = self._host
        block_ms: int | None = None
        if block:
            remaining = self._lease.lease_remaining_ms(monotonic_ms()) - _LEASE_MARGIN_MS
            block_ms = min(host.options.block_ms, remaining)
            if block_ms < _MIN_BLOCK_MS:
                # Too little lease left to block; wait for the next heartbeat.
                await self._acks.flush()
                await self.interruptibly(host.wait_for_change())
                return [], None
            if self._retries:  # wake up for the next parked retry
                block_ms = max(
                    _MIN_BLOCK_MS, min(block_ms, self._retries.until_due_ms(monotonic_ms()))
                )
        if self._acks.rare or (block_ms is not None and self._acks.commits):
            await self._acks.flush()  # rare paths; commits before a read that may block
        # The acks (and commit scripts, before a read that cannot block) of the last batch
        # go out in the same round trip as this read (one pipeline, one key), ahead of it.
        acks = self._acks.take()
        commits, chunks, ahead = self._acks.take_commits() if block_ms is None else ([], [], [])
        entries: list[Entry] | Exception = []
        ahead_replies: list[Any] = []
        wanted, marks = self.idempotence is not None, None
        try:
            with self._observed_read() as tally:
                sent = self._io.read(count, block_ms, acks, ahead, ahead_replies, with_marks=wanted)
                read = self._within_lease(sent)
                reply = await (read if block_ms is None else self.interruptibly(read))
                if reply is None:  # halted while blocking: the XACK's fate is unknown
                    self._acks.requeue(acks)
                    acks = []
                else:
                    ack_reply, entries, marks = reply
                    if acks:
                        self._acks.book(acks, ack_reply)
                        acks = []  # booked or queued again
                    self._acks.book_ridden(commits, chunks, ahead_replies)
                    commits = []
                    if isinstance(entries, Exception):
                        raise entries
                    tally.count = len(entries)
        except BaseException:
            # Cancelled, cut by the lease or failed: whether the XACK ran is
            # unknown, so it is sent again (an XACK of an acked id is a no-op)
            # with the next read or the final flush, before the shard is
            # reported revoked or drained.
            self._acks.requeue(acks)
            self._acks.requeue_commits(commits)
            raise
        assert not isinstance(entries, Exception)
        self._acks.pending_count += tally.count
        return entries, marks

    async def _claim(self, count: int) -> list[Entry]:
        """One XAUTOCLAIM step; goes on claiming with the next read until the end."""
        with self._observed_read() as tally:
            cursor, entries = await self._within_lease(
                self._io.autoclaim(self._claim_cursor, count)
            )
            tally.count = len(entries)
        self._claim_cursor = cursor
        self._claiming = cursor != END_OF_PEL
        self._acks.pending_count += tally.count
        if entries:
            log.debug(
                "%s claimed %d pending entries of %s", self.member_id, tally.count, self.stream_key
            )
        if not self._claiming:
            await self._io.forget_idle_consumers()
        return entries

    async def reclaim(self, ids: list[bytes]) -> list[Entry]:
        """Fetch our own pending entries again (``XCLAIM``: one more delivery each)."""
        with self._observed_read() as tally:
            entries: list[Entry] = await self._within_lease(self._io.claim(ids))
            tally.count = len(entries)
        return entries

    async def _delivery_counts(self, entries: list[Entry]) -> dict[bytes, int]:
        """Redis' delivery counter of claimed entries (rare: a handoff, a retry).
        If it fails they are counted as a second delivery, the least they can have."""
        if not entries:
            return {}
        counts = await self._io.delivery_counts(entries)
        return counts if counts is not None else {entry_id: 2 for entry_id, _ in entries}

    @contextlib.contextmanager
    def _observed_read(self) -> Iterator[_Tally]:
        """Bracket one read for the read observer (tests prove no shard had two readers)."""
        observer = self._host.observer
        epoch = self._lease.epoch
        tally = _Tally()
        if observer is not None:
            observer.read_started(self.shard, self.member_id, epoch)
        try:
            yield tally
        finally:
            if observer is not None:
                observer.read_finished(self.shard, self.member_id, epoch, tally.count)

    # -- carrying out the failure policy (for the dispatcher) ------------------------------

    def leave_pending(self, ids: list[bytes]) -> None:
        self._redeliver.extend(ids)

    async def flush(self) -> None:
        await self._acks.flush()

    def park(self, message: Message, delay_ms: int) -> None:
        # The next read's BLOCK is cut to the first due retry (_read_new).
        self._retries.park(message.raw_id, message.delivery_count + 1, monotonic_ms() + delay_ms)

    def halt_shard(self, message: Message, decision: Decision) -> None:
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
        self._host.shard_halted(self.shard, message.id)

    async def dead_letter(self, message: Message, decision: Decision) -> bool:
        """Dead-letter and ack the entry (``AckQueue.dead_letter``); False if Redis failed."""
        if self.aborted:
            return True  # lost: another member may own the shard now
        if not await self._acks.dead_letter(message, decision):
            return False
        self._host.dead_lettered()
        return True

    # -- reports ---------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return self._acks.pending_count

    def progress(self) -> ShardConsumptionProgress:
        return ShardConsumptionProgress(
            shard=ShardId(shard_index=self.shard),
            stream_key=self.stream_key,
            last_delivered_id=self.last_delivered_id.decode() if self.last_delivered_id else None,
            last_acked_id=acked.decode() if (acked := self._acks.last_acked_id) else None,
            pending_count=self._acks.pending_count,
        )


@dataclass(slots=True)
class _Tally:
    count: int = 0
