"""The Redis commands of one shard for one member: reads, claims, acks, dead letters.

A :class:`ShardIO` knows the shard's key, the consumer group, the member's
consumer name and how to talk to this Redis; it decides nothing (when to
read, what to ack, what to dead-letter: ``streamkit.consumer.shard_reader``).
Each command is encoded in one place:

* ``XREADGROUP`` (:func:`xreadgroup_command`), sent over streamkit's lean
  pipeline on a standalone Redis (``streamkit.connections.send_commands``: no
  timer per reply, no per-command bookkeeping on a consumer's hottest round
  trip) and through redis-py on a cluster; the acks of the last read ride
  along in the same round trip (one key, so one node in a cluster too);
* the dead letter's ``XADD`` (:meth:`ShardIO.dead_letter_command`);
* the settling of acked, ack-deleted and dead-lettered entries
  (:meth:`ShardIO.settle`), which is where ``XACKDEL`` (Redis 8.2+) or
  ``XACK`` + ``XDEL`` in one ``MULTI`` is chosen;
* an idempotent listener's fencing token, marker check and commits
  (:meth:`ShardIO.take_fence`, :meth:`ShardIO.marked`, :meth:`ShardIO.commit`;
  ``streamkit.consumer.idempotence``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any

import redis.asyncio as redis_asyncio
from redis.exceptions import RedisError, ResponseError

from streamkit.connections import AsyncRedis, send_commands
from streamkit.consumer.idempotence import Commit, Idempotence, fence_key, marker_key
from streamkit.publisher.idempotence import IDEMPOTENCY_FIELD
from streamkit.redis_health import describe_error
from streamkit.scripts import COMMIT, COMMIT_ACKS, READ_MARKED, is_noscript

__all__ = [
    "END_OF_PEL",
    "Entry",
    "LeaseCut",
    "ShardIO",
    "id_key",
    "later_id",
    "read_entries",
    "supports_xackdel",
    "xreadgroup_command",
]

log = logging.getLogger("streamkit.poller")
#: An idempotent listener's commits per script (Lua's unpack has a limit).
_COMMITS_PER_SCRIPT = 500

#: A stream entry as Redis returns it: (id, fields; None for a trimmed pending entry).
Entry = tuple[bytes, Any]
#: The cursor ``XAUTOCLAIM`` answers once the pending list was walked through.
END_OF_PEL = b"0-0"


class LeaseCut(Exception):
    """A Redis command was abandoned because the assignment lease ended."""


def id_key(entry_id: bytes) -> tuple[int, int]:
    """An entry id as a sortable pair (stream order)."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def later_id(a: bytes | None, b: bytes) -> bytes:
    """The later of two entry ids (``a`` may be None: none yet)."""
    return b if a is None or id_key(b) > id_key(a) else a


def xreadgroup_command(
    group: str, consumer: str, key: str, count: int, block_ms: int | None
) -> tuple[Any, ...]:
    """``XREADGROUP`` of new entries of one stream (``>``)."""
    command: tuple[Any, ...] = ("XREADGROUP", "GROUP", group, consumer, "COUNT", count)
    if block_ms is not None:
        command += ("BLOCK", block_ms)
    return (*command, "STREAMS", key, ">")


def read_entries(reply: Any, *, raw: bool) -> list[Entry]:
    """The entries of a one-stream ``XREADGROUP`` reply.

    ``raw``: the reply as Redis sent it (the lean pipeline: field lists); else
    as redis-py parsed it (fields as dicts).  RESP2 lists and RESP3 maps alike;
    None or empty: nothing arrived.
    """
    if not reply:
        return []
    if isinstance(reply, dict):
        entries: Any = next(iter(reply.values()))
        if not raw:
            entries = entries[0]  # redis-py wraps a stream's entries in a list
    else:
        entries = reply[0][1]
    if not raw:
        parsed: list[Entry] = entries
        return parsed
    return _entries(entries)


def _entries(raw: Any) -> list[Entry]:
    """Entries as Redis sends them (field lists) as (id, field dict) pairs."""
    out: list[Entry] = []
    for entry_id, flat in raw:
        if flat is None:  # a pending entry trimmed away
            out.append((entry_id, None))
        else:
            pairs = iter(flat)
            out.append((entry_id, dict(zip(pairs, pairs, strict=True))))
    return out


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
    except RedisError as exc:
        # A cluster client routes by redis-py's copy of the server's command
        # table and refuses, before sending, a command the servers lack.
        if "doesn't exist in redis commands" in str(exc).lower():
            return False
        raise
    return True


@dataclass(eq=False)
class ShardIO:
    """One shard's commands, for one member (its consumer name)."""

    redis: AsyncRedis
    _: KW_ONLY
    stream_key: str
    consumer_group: str
    member_id: str
    xackdel: bool
    dead_letter_key: str
    dead_letter_maxlen: InitVar[int]

    def __post_init__(self, dead_letter_maxlen: int) -> None:
        head = ("XADD", self.dead_letter_key, "MAXLEN", "~", dead_letter_maxlen, "*")
        self._dead_letter_head = head
        #: Redis Cluster: a dead letter and its shard are in different slots.
        self.cluster = isinstance(self.redis, redis_asyncio.RedisCluster)
        self.marker_key = marker_key(self.stream_key, self.consumer_group)
        self.fence_key = fence_key(self.stream_key, self.consumer_group)

    def log_read_error(self, exc: BaseException, failures: int, address: str) -> None:
        """Log the 1st, 10th, 20th ... failure in a row of this shard's reads."""
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
                address,
                failures,
                describe_error(exc),
            )

    # -- idempotent listeners ------------------------------------------------------

    async def take_fence(self) -> bytes:
        """Become the shard's newest reader: the commits of earlier ones fail."""
        return str(await self.redis.incr(self.fence_key)).encode()

    async def marked(self, ids: Sequence[bytes]) -> list[bool]:
        """Whether each idempotency id has a marker (``ZMSCORE``, one round trip)."""
        (scores,) = await send_commands(self.redis, [("ZMSCORE", self.marker_key, *ids)])
        if isinstance(scores, Exception):
            raise scores
        return [score is not None for score in scores]

    def commit_command(
        self, commits: Sequence[Commit], token: bytes, idempotence: Idempotence
    ) -> tuple[Any, ...]:
        """One script for ``commits`` (``streamkit.scripts.COMMIT``, or
        ``COMMIT_ACKS`` when none of them staged effects)."""
        keys: list[str] = [self.stream_key, self.marker_key, self.fence_key]
        if not any(commit.effects for commit in commits):
            dels = [commit.entry_id for commit in commits if commit.delete]
            return COMMIT_ACKS.command(
                keys,
                [
                    self.consumer_group,
                    token,
                    int(idempotence.marker_ttl * 1000),
                    idempotence.max_markers,
                    len(commits),
                    *(commit.entry_id for commit in commits),
                    *(commit.idempotency_id for commit in commits),
                    len(dels),
                    *dels,
                ],
            )
        index: dict[str, int] = {}
        args: list[Any] = [
            self.consumer_group,
            token,
            int(idempotence.marker_ttl * 1000),
            idempotence.max_markers,
            len(commits),
        ]
        for commit in commits:
            args += [
                commit.entry_id,
                commit.idempotency_id,
                "del" if commit.delete else "ack",
                len(commit.effects),
            ]
            for command, key, effect_args in commit.effects:
                if key not in index:
                    keys.append(key)
                    index[key] = len(keys)  # Lua counts from 1
                args += [command, index[key], len(effect_args), *effect_args]
        return COMMIT.command(keys, args)

    def commit_commands(
        self, commits: Sequence[Commit], token: bytes, idempotence: Idempotence
    ) -> tuple[list[Sequence[Commit]], list[tuple[Any, ...]]]:
        """The scripts for ``commits`` (one per ``_COMMITS_PER_SCRIPT``): (chunks, commands)."""
        chunks = [
            commits[lo : lo + _COMMITS_PER_SCRIPT]
            for lo in range(0, len(commits), _COMMITS_PER_SCRIPT)
        ]
        return chunks, [self.commit_command(chunk, token, idempotence) for chunk in chunks]

    @staticmethod
    def commit_replies(chunks: Sequence[Sequence[Commit]], replies: Sequence[Any]) -> list[Any]:
        """One reply per commit out of one per script (see :meth:`commit`)."""
        out: list[Any] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, BaseException):
                out += [reply] * len(chunk)
            elif isinstance(reply, int):
                # COMMIT_ACKS: how many markers were new.  Every entry was
                # acked and none had effects, so which ones found theirs
                # does not matter, only how many (the duplicates counted).
                out += [1] * reply + [0] * (len(chunk) - reply)
            else:
                out += [
                    ResponseError(r.decode() if isinstance(r, bytes) else r)
                    if isinstance(r, bytes | str)
                    else int(r)
                    for r in reply
                ]
        return out

    async def commit(
        self, commits: Sequence[Commit], token: bytes, idempotence: Idempotence
    ) -> list[Any]:
        """Commit ``commits``, in one round trip (a script per ``_COMMITS_PER_SCRIPT``).

        One reply per commit: 1 (committed), 0 (its marker existed: acked,
        effects skipped) or a ``ResponseError`` (``is_fenced``, or an effect
        refused: nothing of that commit was written).  A lost script cache
        (restart, failover) is loaded and the scripts that met it sent again.
        """
        chunks, commands = self.commit_commands(commits, token, idempotence)
        replies = await send_commands(self.redis, commands)
        again = [i for i, reply in enumerate(replies) if is_noscript(reply)]
        if again:
            for script in (COMMIT, COMMIT_ACKS):  # whichever met it: both are small
                await self.redis.script_load(script.source)
            retried = await send_commands(self.redis, [commands[i] for i in again])
            for i, reply in zip(again, retried, strict=True):
                replies[i] = reply
        return self.commit_replies(chunks, replies)

    # -- reads -------------------------------------------------------------------

    async def read(
        self,
        count: int,
        block_ms: int | None,
        acks: Sequence[bytes],
        ahead: Sequence[tuple[Any, ...]] = (),
        ahead_replies: list[Any] | None = None,
        *,
        with_marks: bool = False,
    ) -> tuple[Any, list[Entry] | Exception, list[bool] | None]:
        """``XREADGROUP`` of up to ``count`` new entries, after an ``XACK`` of
        ``acks`` in the same round trip (and before it the commands ``ahead``:
        an idempotent listener's commit scripts, whose replies go to
        ``ahead_replies``).

        ``with_marks`` (an idempotent listener's read that does not block):
        the read is ``READ_MARKED``, which also answers whether each entry's
        idempotency id has a marker, so no ``ZMSCORE`` round trip follows.

        Returns the ``XACK``'s reply (None without acks; an exception if it
        failed), the entries or the read's error reply, and the marks (None
        when not asked or the script was not cached: it is loaded for the next
        read, and the caller checks the markers itself).  A failed round trip
        raises.
        """
        marked = with_marks and block_ms is None
        if marked:
            read = READ_MARKED.command(
                [self.stream_key, self.marker_key],
                [self.consumer_group, self.member_id, count, IDEMPOTENCY_FIELD],
            )
        else:
            read = xreadgroup_command(
                self.consumer_group, self.member_id, self.stream_key, count, block_ms
            )
        ahead = list(ahead)
        if acks:
            ahead.append(("XACK", self.stream_key, self.consumer_group, *acks))
        replies = await send_commands(self.redis, [*ahead, read])
        reply = replies[-1]
        ack_reply = replies[-2] if acks else None
        if ahead_replies is not None:
            ahead_replies[:] = replies[: len(ahead) - (1 if acks else 0)]
        if marked:
            if is_noscript(reply):  # nothing was read: load it for the next read
                await self.redis.script_load(READ_MARKED.source)
                return ack_reply, [], None
            if isinstance(reply, Exception):
                return ack_reply, reply, None
            entries, marks = reply
            return ack_reply, _entries(entries), [bool(mark) for mark in marks]
        if isinstance(reply, Exception):
            return ack_reply, reply, None
        # send_commands hands back what Redis sent on a standalone server and
        # what redis-py's callbacks made of it on a cluster.
        return ack_reply, read_entries(reply, raw=not self.cluster), None

    async def autoclaim(self, cursor: bytes, count: int) -> tuple[bytes, list[Entry]]:
        """One ``XAUTOCLAIM`` step (min-idle 0): the next cursor and the entries
        still there (trimmed ones are left out)."""
        reply: Any = await self.redis.xautoclaim(
            self.stream_key, self.consumer_group, self.member_id, 0, cursor, count=count
        )
        return reply[0], [e for e in reply[1] if e[1] is not None]

    async def claim(self, ids: Sequence[bytes]) -> list[Entry]:
        """Fetch our own pending entries again (``XCLAIM`` to ourselves, min-idle 0).

        Redis adds one to each entry's delivery counter: that is the attempt
        count a retry is known by, on this member or the next owner.
        """
        reply: Any = await self.redis.xclaim(
            self.stream_key, self.consumer_group, self.member_id, 0, list[Any](ids)
        )
        return [e for e in reply if e[1] is not None]

    async def claim_and_read(
        self, ids: Sequence[bytes], more: int
    ) -> tuple[list[Entry], list[Entry]]:
        """``claim(ids)`` and an ``XREADGROUP`` of up to ``more`` new entries, in
        one round trip (one key, so one node in a cluster too)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xclaim(self.stream_key, self.consumer_group, self.member_id, 0, list[Any](ids))
        if more > 0:
            pipe.execute_command(
                *xreadgroup_command(
                    self.consumer_group, self.member_id, self.stream_key, more, None
                )
            )
        replies = await pipe.execute()
        claimed: list[Entry] = [e for e in replies[0] if e[1] is not None]
        fresh = read_entries(replies[1], raw=False) if more > 0 else []
        return claimed, fresh

    async def delivery_counts(self, entries: Sequence[Entry]) -> dict[bytes, int] | None:
        """Redis' delivery counter of each entry (``XPENDING`` per id, one round
        trip); None if Redis failed."""
        pipe = self.redis.pipeline(transaction=False)
        for entry_id, _ in entries:
            pipe.xpending_range(self.stream_key, self.consumer_group, entry_id, entry_id, 1)
        try:
            replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("%s: no delivery counts for %s: %r", self.member_id, self.stream_key, exc)
            return None
        counts: dict[bytes, int] = {}
        for (entry_id, _), reply in zip(entries, replies, strict=True):
            # A claimed entry was delivered at least once before this claim.
            counts[entry_id] = int(reply[0]["times_delivered"]) if reply else 2
        return counts

    async def forget_idle_consumers(self) -> None:
        """Delete the other Redis consumers of this shard that hold nothing.

        Member ids are drawn anew on every start, so without this the group's
        consumer list grows with every restart.  Safe once we hold the shard
        and claimed its leftovers: no other member reads it while we do, so an
        empty consumer stays empty until we delete it (a consumer that still
        has pending entries is kept: deleting it would drop them unredelivered).
        A member given the shard later simply creates its consumer again.
        """
        try:
            consumers = await self.redis.xinfo_consumers(self.stream_key, self.consumer_group)
            for consumer in consumers:
                name = consumer["name"]
                name = name.decode() if isinstance(name, bytes) else str(name)
                if name != self.member_id and int(consumer["pending"]) == 0:
                    await self.redis.xgroup_delconsumer(self.stream_key, self.consumer_group, name)
        except RedisError as exc:  # housekeeping only: try again on the next grant
            log.debug("%s: consumers of %s kept: %r", self.member_id, self.stream_key, exc)

    # -- settling --------------------------------------------------------------------

    def dead_letter_command(self, fields: dict[Any, Any]) -> tuple[Any, ...]:
        """The ``XADD`` of one dead letter (``MAXLEN ~`` the policy's bound)."""
        return (*self._dead_letter_head, *(x for pair in fields.items() for x in pair))

    async def dead_letter(self, fields: dict[Any, Any]) -> None:
        """Write one dead letter on its own (a cluster: see ``settle``)."""
        await self.redis.execute_command(*self.dead_letter_command(fields))

    async def settle(
        self,
        acks: Sequence[bytes],
        dels: Sequence[bytes],
        letters: Sequence[tuple[dict[Any, Any], bytes]],
    ) -> None:
        """Ack ``acks``, ack and delete ``dels``, and write each dead letter of
        ``letters`` (fields, entry id) then ack its entry, in one round trip.

        Dead letters and their acks go in one ``MULTI``, so an entry is never
        acked without its dead letter (standalone Redis only: in a cluster the
        two keys live in different slots).  Deletes use ``XACKDEL`` where the
        server has it, else ``XACK`` + ``XDEL`` in one ``MULTI`` on the shard
        key (a single slot, so valid in a cluster too).
        """
        commands = [self.dead_letter_command(fields) for fields, _ in letters]
        acked = [*acks, *(entry_id for _, entry_id in letters)]
        atomic = bool(letters)
        if dels and not self.xackdel:
            acked += dels
            atomic = True
        if acked:
            commands.append(("XACK", self.stream_key, self.consumer_group, *acked))
        if dels:
            if self.xackdel:
                commands.append(
                    ("XACKDEL", self.stream_key, self.consumer_group, "IDS", len(dels), *dels)
                )
            else:
                commands.append(("XDEL", self.stream_key, *dels))
        if len(commands) == 1 and not atomic:
            await self.redis.execute_command(*commands[0])
            return
        pipe = self.redis.pipeline(transaction=atomic)
        for command in commands:
            pipe.execute_command(*command)
        await pipe.execute()
