"""Idempotent publishing: ids, the dedup window and the command that checks and appends.

An idempotent publish carries an idempotency id: the caller's (an order id)
or one the publisher draws (its producer id + a sequence number).  The id is
written in the entry (field :data:`IDEMPOTENCY_FIELD`, so consumers can mark
it, docs/consumer.md) and checked against the shard's dedup record by the
same script that appends (``streamkit.scripts.IDEMPOTENT_XADD``): a retry of
a publish whose reply was lost returns the first attempt's entry id.

The dedup record of shard key ``K`` is ``{K}:idem`` (hash) and
``{K}:idem:order`` (sorted set), in ``K``'s cluster slot.  It keeps an id for
at least ``window`` seconds unless more than ``max_ids`` newer ids arrived at
that shard meanwhile: memory per shard is bounded by ``max_ids``.
"""

from __future__ import annotations

import functools
import itertools
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from redis.exceptions import ResponseError

from streamkit.connections import AsyncRedis
from streamkit.scripts import IDEMPOTENT_XADD, IDEMPOTENT_XADD_MANY, slot_key

__all__ = [
    "IDEMPOTENCY_FIELD",
    "IDMP_DEFAULT_MAX_IDS",
    "IDMP_DEFAULT_WINDOW",
    "PublishIdempotence",
    "supports_idmp",
]

#: The entry field that carries the idempotency id.
IDEMPOTENCY_FIELD: Final = "idempotency-id"
#: What Redis 8.6's ``XADD IDMP`` keeps per stream and producer unless a
#: ``XCFGSET`` says otherwise (which clears every producer's ids: streamkit
#: never sends it).
IDMP_DEFAULT_WINDOW: Final = 100.0
IDMP_DEFAULT_MAX_IDS: Final = 100
# The producer id under which caller-given ids go to XADD IDMP: all callers
# share one id space, as they do in the script's record.
_CALLER_PRODUCER: Final = "streamkit-caller"


@dataclass(slots=True)
class PublishIdempotence:
    """How a publisher deduplicates its retries (``Publisher(idempotent=...)``).

    ``window``: seconds an id is remembered per shard (at least; default one
    hour).  ``max_ids``: at most this many ids per shard (default 100,000,
    about 21 MiB per shard at ~30-byte ids, docs/performance.md); the oldest
    go first.
    ``producer_id``: the prefix of the ids the publisher draws (default: a
    random one per publisher, so two processes never collide).
    """

    window: float = 3600.0
    max_ids: int = 100_000
    producer_id: str = field(default_factory=lambda: secrets.token_hex(8))
    #: Redis 8.6+ ``XADD IDMP`` found at start (``supports_idmp``) and usable:
    #: its server-side window covers ours.
    native: bool = False
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        if not self.window > 0:
            raise ValueError(f"window must be > 0 seconds, got {self.window!r}")
        if isinstance(self.max_ids, bool) or not isinstance(self.max_ids, int) or self.max_ids < 1:
            raise ValueError(f"max_ids must be an integer >= 1, got {self.max_ids!r}")
        if not self.producer_id or ":" in self.producer_id:
            raise ValueError(f"producer_id must be non-empty without ':', got {self.producer_id!r}")

    def next_id(self) -> str:
        """A fresh id: ``<producer id>:<sequence>``."""
        return f"{self.producer_id}:{next(self._seq)}"

    def native_fits(self) -> bool:
        """Whether ``XADD IDMP`` with the server's default window is as strong as ours."""
        return self.window <= IDMP_DEFAULT_WINDOW and self.max_ids <= IDMP_DEFAULT_MAX_IDS

    def command(
        self, stream_key: str, idem_id: str, maxlen: int | None, args: list[Any], *, auto: bool
    ) -> tuple[Any, ...]:
        """The check-and-append of one entry (``args``: its fields, id included)."""
        if self.native:
            producer, _, iid = idem_id.rpartition(":") if auto else (_CALLER_PRODUCER, "", idem_id)
            trim: tuple[Any, ...] = () if maxlen is None else ("MAXLEN", "~", maxlen)
            return ("XADD", stream_key, "NOMKSTREAM", "IDMP", producer, iid, *trim, "*", *args)
        return IDEMPOTENT_XADD.command(
            record_keys(stream_key),
            (
                idem_id,
                int(self.window * 1000),
                self.max_ids,
                "" if maxlen is None else maxlen,
                *args,
            ),
        )

    def command_many(
        self, stream_key: str, maxlen: int | None, batch: Sequence[tuple[str, list[Any]]]
    ) -> tuple[Any, ...]:
        """The check-and-append of many entries of one shard (``batch``: (id,
        fields) each), one script call; not for ``native`` (``XADD IDMP``)."""
        args: list[Any] = [int(self.window * 1000), self.max_ids, "" if maxlen is None else maxlen]
        args.append(len(batch))
        for idem_id, fields in batch:
            args.append(idem_id)
            args.append(len(fields))
            args += fields
        return IDEMPOTENT_XADD_MANY.command(record_keys(stream_key), args)


@functools.lru_cache(maxsize=8192)
def record_keys(stream_key: str) -> tuple[str, str, str]:
    """The keys of both publish scripts: the stream and its dedup record (a
    hash and a sorted set in the stream's slot).  Remembered: deriving them
    checks both slots, a CRC16 of each key in Python, once per publish."""
    return stream_key, slot_key(stream_key, "idem"), slot_key(stream_key, "idem:order")


async def send_merged(
    send_many: Callable[[Sequence[tuple[Any, ...]]], Awaitable[list[Any]]],
    commands: Sequence[tuple[Any, ...]],
) -> list[Any]:
    """``send_many(commands)``, the one-entry check-and-appends among them
    merged into one batched script per shard (``IDEMPOTENT_XADD_MANY``).

    For the coalescer: concurrent ``publish()`` calls are a pipeline of
    one-entry scripts; merged, Redis runs one script per shard instead of
    one per entry.  The same calls in the same order per shard, so the same
    outcome; each command still gets its own reply (or error)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for n, command in enumerate(commands):
        if command[0] == "EVALSHA" and command[1] == IDEMPOTENT_XADD.sha:
            # KEYS (3), then window, max ids, maxlen: one batch per shard and settings.
            groups.setdefault((*command[3:6], *command[7:10]), []).append(n)
    merged = [indexes for indexes in groups.values() if len(indexes) > 1]
    if not merged:
        return await send_many(commands)
    taken = {n for indexes in merged for n in indexes}
    sends: list[tuple[Any, ...]] = [c for n, c in enumerate(commands) if n not in taken]
    for indexes in merged:
        first = commands[indexes[0]]
        args: list[Any] = [*first[7:10], len(indexes)]
        for n in indexes:
            args.append(commands[n][6])  # the id
            fields = commands[n][10:]
            args.append(len(fields))
            args += fields
        sends.append(IDEMPOTENT_XADD_MANY.command(first[3:6], args))
    replies = await send_many(sends)
    out: list[Any] = [None] * len(commands)
    alone = [n for n in range(len(commands)) if n not in taken]
    for n, reply in zip(alone, replies[: len(alone)], strict=True):
        out[n] = reply
    for indexes, reply in zip(merged, replies[len(alone) :], strict=True):
        if isinstance(reply, BaseException):
            for n in indexes:
                out[n] = reply
        else:
            for n, one in zip(indexes, reply, strict=True):
                out[n] = one
    return out


def appended(reply: Any) -> tuple[Any, bool] | None:
    """(entry id, whether it was a repeat) of a check-and-append's reply; None:
    no stream (``NOMKSTREAM``).  ``XADD IDMP`` answers the entry id alone."""
    if reply is None:
        return None
    if isinstance(reply, list | tuple):
        return reply[0], bool(int(reply[1]))
    return reply, False


async def supports_idmp(redis: AsyncRedis) -> bool:
    """Whether the server has ``XADD ... IDMP`` (Redis 8.6+); asked once at start.

    Probes with ``NOMKSTREAM`` on a key that does not exist, which writes
    nothing where the option exists; older servers take ``IDMP`` for an entry
    id and refuse it.  Any refusal means "no": the script is the safe side.
    """
    try:
        await redis.execute_command(
            "XADD", "streamkit:probe:idmp", "NOMKSTREAM", "IDMP", "p", "i", "*", "f", "v"
        )
    except ResponseError:
        return False
    return True
