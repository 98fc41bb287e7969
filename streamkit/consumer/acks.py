"""``AckQueue``: what one shard reader settled and has not sent yet.

Acks are batched per shard: ``msg.ack()`` queues the id, and one ``XACK`` goes
out in the same round trip as the shard's next read (``take``), or on its own
(``flush``) before the reader waits for anything else, and always before the
shard is reported revoked or drained (the final flush).  Ack-deletes and dead
letters keep a round trip of their own (``ShardIO.settle``), and so do an
idempotent listener's commits (marker + effects + ack, one script each, all
of a read's in one round trip).  The queue also books what Redis confirmed,
for the progress a heartbeat reports.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from redis.exceptions import RedisError

from streamkit.backoff import jittered_backoff
from streamkit.consumer.failure import dead_letter_fields
from streamkit.consumer.idempotence import Commit, CommitCounts, Idempotence
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.message import Message, Settlement
from streamkit.consumer.shard_io import Entry, LeaseCut, ShardIO, id_key, later_id
from streamkit.redis_health import RedisReachability, describe_error, is_unreachable_error
from streamkit.results import Decision
from streamkit.scripts import is_fenced, is_noscript

__all__ = ["AckQueue", "backoff_s"]

log = logging.getLogger("streamkit.poller")
T = TypeVar("T")

_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 5.0


def backoff_s(failures: int) -> float:
    """The pause after ``failures`` failed Redis calls in a row (jittered)."""
    return jittered_backoff(failures, _BACKOFF_MIN_S, _BACKOFF_MAX_S, random.random())


class AckQueue:
    """The unsent acks, ack-deletes and dead letters of one shard reader."""

    def __init__(
        self,
        io: ShardIO,
        reachability: RedisReachability,
        *,
        ordered: bool,
        idempotence: Idempotence | None = None,
        counts: CommitCounts | None = None,
    ) -> None:
        self._io = io
        self._reachability = reachability
        self._ordered = ordered
        self.idempotence = idempotence
        #: This reader's fencing token (idempotent listeners; None: not taken yet).
        self.token: bytes | None = None
        #: Commits of an idempotent listener, in the order they were settled.
        self.commits: list[Commit] = []
        #: A commit that rode with a read met ``NOSCRIPT``: the next ones go
        #: out on their own (``flush``), which loads the script.
        self.script_lost = False
        #: Shared by the member's readers (duplicates skipped, commits fenced).
        self.counts = counts or CommitCounts()
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
        """Ack-deletes or dead letters are queued (they do not ride with a read;
        an idempotent listener's commits do, as plain acks)."""
        return bool(self.dels or self.letters or (self.commits and self.script_lost))

    def drop(self) -> None:
        self.dropped = True
        self.commits.clear()
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

    def _requeue(
        self, acks: list[bytes], dels: list[bytes], letters: list[tuple[dict[Any, Any], bytes]]
    ) -> None:
        self.acks[:0] = acks
        self.dels[:0] = dels
        self.letters[:0] = letters

    async def flush(self, *, final: bool = False) -> None:
        """Send everything queued (the final flush tries three times)."""
        if self.commits:
            await self._flush_commits(final)
        acks, dels, letters = self.acks, self.dels, self.letters
        if not acks and not dels and not letters:
            return
        self.acks, self.dels, self.letters = [], [], []
        io = self._io
        try:
            await self._sent(lambda: io.settle(acks, dels, letters), final)
        except (RedisError, OSError) as exc:
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
                self._requeue(acks, dels, letters)
            return
        except BaseException:
            # Cancelled (the member stopping, or a flush past its bound):
            # whether Redis ran it is unknown, so it goes out again with the
            # final flush (an XACK of an acked id changes nothing).
            if not final:
                self._requeue(acks, dels, letters)
            raise
        self._acked(acks, dels)
        # Apart: each list is in stream order by itself, not the two joined.
        self._acked([entry_id for _, entry_id in letters], [])

    def commit(self, message: Message, how: Settlement) -> None:
        """Queue an idempotent listener's commit of ``message``."""
        assert self.idempotence is not None
        self.commits.append(
            Commit(
                message.raw_id,
                self.idempotence.id_of(message.raw_id, message.raw_fields),
                delete=how is Settlement.ACK_DEL,
                effects=message.staged_effects(),
            )
        )

    async def skip_marked(
        self,
        entries: list[Entry],
        within_lease: Callable[[Awaitable[Any]], Awaitable[Any]],
        marks: list[bool] | None = None,
    ) -> list[Entry]:
        """The entries whose idempotency id has no marker; the others are
        acked (a commit that finds the marker: counted, no effects) unhandled.

        ``marks``: what the read already answered (``READ_MARKED``), else
        the markers are checked here (``ZMSCORE``, one round trip)."""
        assert self.idempotence is not None
        ids = [self.idempotence.id_of(entry_id, fields) for entry_id, fields in entries]
        try:
            marked = marks if marks is not None else await within_lease(self._io.marked(ids))
        except (RedisError, OSError, LeaseCut) as exc:
            # The commit checks the marker again: only the handler's run is at stake.
            log.debug(
                "%s: marker check of %s failed: %r", self._io.member_id, self._io.stream_key, exc
            )
            return entries
        if not any(marked):
            return entries
        fresh: list[Entry] = []
        for entry, idem, done in zip(entries, ids, marked, strict=True):
            if done:
                self.commits.append(Commit(entry[0], idem))
            else:
                fresh.append(entry)
        return fresh

    async def _flush_commits(self, final: bool) -> None:
        commits, self.commits = self.commits, []
        self.script_lost = False
        io, idempotence, token = self._io, self.idempotence, self.token
        assert idempotence is not None and token is not None
        try:
            replies = await self._sent(lambda: io.commit(commits, token, idempotence), final)
        except (RedisError, OSError) as exc:
            log.warning(
                "%s: could not commit %d entries of %s%s: %s",
                io.member_id,
                len(commits),
                io.stream_key,
                "" if final else ", will retry",
                describe_error(exc),
            )
            if not final and not self.dropped:
                self.commits[:0] = commits
            return
        except BaseException:
            # Cancelled: sent again later, where a commit that ran answers 0.
            if not final and not self.dropped:
                self.commits[:0] = commits
            raise
        self.book_commits(commits, replies)

    async def _sent(self, send: Callable[[], Awaitable[T]], final: bool) -> T:
        """``send()``: once, or up to three times with backoff for the final
        flush; Redis reachability hears of each outcome; the last error is raised."""
        attempt = 1
        while True:
            try:
                result = await send()
            except (RedisError, OSError) as exc:
                if is_unreachable_error(exc):
                    self._reachability.failed(monotonic_ms(), exc)
                if attempt >= (3 if final else 1):
                    raise
                await anyio.sleep(backoff_s(attempt))
                attempt += 1
            else:
                self._reachability.succeeded()
                return result

    def take_commits(self) -> tuple[list[Commit], list[Any], list[tuple[Any, ...]]]:
        """The queued commits, as scripts to send ahead of the next read: (commits,
        chunks, commands); ``book_commits`` them after, or ``requeue_commits``."""
        commits, self.commits = self.commits, []
        if not commits:
            return [], [], []
        assert self.idempotence is not None and self.token is not None
        chunks, commands = self._io.commit_commands(commits, self.token, self.idempotence)
        return commits, chunks, commands

    def requeue_commits(self, commits: list[Commit]) -> None:
        """Commits whose fate is unknown go out again: one that ran answers 0
        the second time (its marker exists), nothing is applied twice."""
        if commits and not self.dropped:
            self.commits[:0] = commits

    def book_ridden(self, commits: list[Commit], chunks: list[Any], replies: list[Any]) -> None:
        """Book commits that rode along with a read; those that met a lost
        script cache (``NOSCRIPT``: nothing ran) are queued again."""
        again = [
            c for chunk, r in zip(chunks, replies, strict=True) if is_noscript(r) for c in chunk
        ]
        if again:
            self.requeue_commits(again)
            self.script_lost = True
        kept = [(chunk, r) for chunk, r in zip(chunks, replies, strict=True) if not is_noscript(r)]
        if kept:
            done = [c for chunk, _ in kept for c in chunk]
            self.book_commits(
                done, self._io.commit_replies([c for c, _ in kept], [r for _, r in kept])
            )

    def book_commits(self, commits: list[Commit], replies: list[Any]) -> None:
        """Count and book the replies of ``commits`` (one per commit)."""
        io = self._io
        done: list[bytes] = []
        for commit, reply in zip(commits, replies, strict=True):
            if isinstance(reply, BaseException):
                if is_fenced(reply):
                    # A newer reader holds the shard: the entry stays pending
                    # for it, and its marker decides whether anything runs again.
                    self.counts.fenced += 1
                    log.warning(
                        "%s: fenced: commit of %s entry %s refused, nothing applied",
                        io.member_id,
                        io.stream_key,
                        commit.entry_id.decode(),
                    )
                else:
                    # Refused as a whole (an effect on a key of another type):
                    # the entry stays pending and is delivered again.
                    log.error(
                        "%s: commit of %s entry %s refused, nothing applied: %s",
                        io.member_id,
                        io.stream_key,
                        commit.entry_id.decode(),
                        reply,
                    )
                continue
            if int(reply) == 0:
                self.counts.duplicates_skipped += 1
            done.append(commit.entry_id)
        self._acked(done, [])

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
