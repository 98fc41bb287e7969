"""``AckQueue``: what one shard reader settled and has not sent yet.

Acks are batched per shard: ``msg.ack()`` queues the id, and one ``XACK`` goes
out in the same round trip as the shard's next read (``take``), or on its own
(``flush``) before the reader waits for anything else, and always before the
shard is reported revoked or drained (the final flush).  Ack-deletes and dead
letters keep a round trip of their own (``ShardIO.settle``).  The queue also
books what Redis confirmed, for the progress a heartbeat reports.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import anyio
from redis.exceptions import RedisError

from streamkit.backoff import jittered_backoff
from streamkit.consumer.failure import dead_letter_fields
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.message import Message
from streamkit.consumer.shard_io import ShardIO, id_key, later_id
from streamkit.redis_health import RedisReachability, describe_error, is_unreachable_error
from streamkit.results import Decision

__all__ = ["AckQueue", "backoff_s"]

log = logging.getLogger("streamkit.poller")

_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 5.0


def backoff_s(failures: int) -> float:
    """The pause after ``failures`` failed Redis calls in a row (jittered)."""
    return jittered_backoff(failures, _BACKOFF_MIN_S, _BACKOFF_MAX_S, random.random())


class AckQueue:
    """The unsent acks, ack-deletes and dead letters of one shard reader."""

    def __init__(self, io: ShardIO, reachability: RedisReachability, *, ordered: bool) -> None:
        self._io = io
        self._reachability = reachability
        self._ordered = ordered
        self.acks: list[bytes] = []
        self.dels: list[bytes] = []
        # Standalone Redis: dead letters (fields, entry id) written in the same
        # MULTI as the acks (ShardIO.settle), so they cost no round trip of their own.
        self.letters: list[tuple[dict[Any, Any], bytes]] = []
        #: Lost: nothing is queued or sent any more.
        self.dropped = False
        #: Entries delivered to this reader and not confirmed acked (progress).
        self.pending_count = 0
        self.last_acked_id: bytes | None = None

    @property
    def rare(self) -> bool:
        """Ack-deletes or dead letters are queued (they do not ride with a read)."""
        return bool(self.dels or self.letters)

    def drop(self) -> None:
        self.dropped = True
        self.acks.clear()
        self.dels.clear()
        self.letters.clear()

    def take(self) -> list[bytes]:
        """The queued acks, to send with the next read (``book`` them after)."""
        acks, self.acks = self.acks, []
        return acks

    def book(self, acks: list[bytes], reply: Any) -> None:
        """Book acks that rode along with a read, or queue them again if the XACK failed."""
        if isinstance(reply, Exception):
            log.warning(
                "%s: ack of %s failed, will retry: %s",
                self._io.member_id,
                self._io.stream_key,
                describe_error(reply),
            )
            self.requeue(acks)
        else:
            self._acked(acks, [])

    def requeue(self, acks: list[bytes]) -> None:
        """Acks whose fate is unknown go out again (an XACK of an acked id is a no-op)."""
        if acks and not self.dropped:
            self.acks[:0] = acks

    async def dead_letter(self, message: Message, decision: Decision) -> bool:
        """Write the entry to the dead-letter stream, then ack it; False if Redis failed.

        Standalone Redis: the ``XADD`` goes out with the acks, in one ``MULTI``
        (``flush``).  In a cluster the two keys usually live in different slots,
        so the ``XADD`` goes first and the ``XACK`` joins the queued acks: a
        crash in between leaves the entry pending and it is dead-lettered again
        (a duplicate dead letter, never a lost entry).
        """
        io = self._io
        fields = dead_letter_fields(
            message.raw_fields,
            stream_key=io.stream_key,
            entry_id=message.id,
            consumer_group=io.consumer_group,
            attempts=message.delivery_count,
            error=decision.error,
        )
        try:
            if io.cluster:
                await io.dead_letter(fields)
                self.acks.append(message.raw_id)
            else:
                self.letters.append((fields, message.raw_id))
        except (RedisError, OSError) as exc:
            log.warning(
                "%s: could not dead-letter %s entry %s to %s (%r); it stays pending",
                io.member_id,
                io.stream_key,
                message.id,
                io.dead_letter_key,
                exc,
            )
            return False
        log.error(
            "%s: dead-lettering %s entry %s to %s after %d attempt(s): %s",
            io.member_id,
            io.stream_key,
            message.id,
            io.dead_letter_key,
            message.delivery_count,
            decision.error,
        )
        return True

    async def flush(self, *, final: bool = False) -> None:
        """Send everything queued (the final flush tries three times)."""
        acks, dels, letters = self.acks, self.dels, self.letters
        if not acks and not dels and not letters:
            return
        self.acks, self.dels, self.letters = [], [], []
        io = self._io
        attempts = 3 if final else 1
        for attempt in range(1, attempts + 1):
            try:
                await io.settle(acks, dels, letters)
            except (RedisError, OSError) as exc:
                if is_unreachable_error(exc):
                    self._reachability.failed(monotonic_ms(), exc)
                if attempt < attempts:
                    await anyio.sleep(backoff_s(attempt))
                    continue
                if final:
                    # Unacked entries stay pending and are redelivered to the
                    # next owner: a duplicate, never a loss.
                    log.warning(
                        "%s: could not ack %d entries of %s: %s",
                        io.member_id,
                        len(acks) + len(dels),
                        io.stream_key,
                        describe_error(exc),
                    )
                else:
                    log.warning(
                        "%s: ack of %s failed, will retry: %s",
                        io.member_id,
                        io.stream_key,
                        describe_error(exc),
                    )
                    self.acks[:0] = acks
                    self.dels[:0] = dels
                    self.letters[:0] = letters
                return
            break
        self._reachability.succeeded()
        self._acked(acks, dels)
        # Apart: each list is in stream order by itself, not the two joined.
        self._acked([entry_id for _, entry_id in letters], [])

    def _acked(self, acks: list[bytes], dels: list[bytes]) -> None:
        """Book entries Redis confirmed acked (progress reports)."""
        self.pending_count = max(0, self.pending_count - len(acks) - len(dels))
        if acks:
            # Ordered: acks come in stream order (a flush precedes every read
            # of older entries), so the last is the latest, and parsing every
            # id would cost more than the rest of the booking.  This is progress
            # reporting only: a handler that acks an older entry late leaves
            # it behind for one batch.
            latest = acks[-1] if self._ordered else max(acks, key=id_key)
            self.last_acked_id = later_id(self.last_acked_id, latest)
        if dels:
            self.last_acked_id = later_id(self.last_acked_id, dels[-1])
