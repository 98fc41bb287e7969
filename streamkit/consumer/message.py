"""The message a stream listener's handler receives."""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from streamkit.consumer.idempotence import Effects

__all__ = ["Message", "Settlement"]


class Settlement(Enum):
    ACK = "ack"
    ACK_DEL = "ack_del"
    NACK = "nack"


class SettlementSink(Protocol):
    """Where a message's ack/nack goes: the shard session that read it."""

    stream_key: str
    consumer_group: str
    member_id: str

    def settle(self, message_id: bytes, how: Settlement) -> None: ...


class _Done:
    """An awaitable that is already finished.

    ``ack()`` does its work when it is *called* (it queues the id for the
    next batched XACK), so a sync handler running in a worker thread can call
    ``msg.ack()`` without an event loop, and an async handler may still write
    ``await msg.ack()``.  A coroutine would do nothing until awaited and warn
    when it is not.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


_DONE = _Done()


class Message:
    """One stream entry, delivered to exactly one handler call at a time.

    Settle it with ``ack()``, ``ack_del()`` or ``nack()`` (the first call
    wins; later ones are ignored).  Unsettled messages stay pending in the
    consumer group and are delivered again after a rebalance or restart
    (at-least-once), so handlers must be idempotent, or the listener declared
    ``idempotent=True`` (markers, and Redis writes staged on :attr:`effects`
    applied exactly once with the ack: docs/consumer.md, "Idempotency").
    """

    __slots__ = (
        "_effects",
        "_fields",
        "_nack_delay_ms",
        "_raw_fields",
        "_raw_id",
        "_settled",
        "_sink",
        "delivery_count",
        "redelivered",
        "shard",
    )

    def __init__(
        self,
        sink: SettlementSink,
        shard: int,
        raw_id: bytes,
        raw_fields: dict[bytes, bytes],
        *,
        redelivered: bool = False,
        delivery_count: int = 1,
    ) -> None:
        self._sink = sink
        self.shard = shard
        self._raw_id = raw_id
        self._raw_fields = raw_fields
        self._fields: dict[str, str] | None = None
        self._settled: Settlement | None = None
        #: True when the entry was claimed from the group's pending list (a
        #: previous delivery, possibly to another member, may have run).
        self.redelivered = redelivered
        #: How many times Redis delivered the entry to the group, this delivery
        #: included (its delivery counter: 1 for a first read, and every claim
        #: adds one, on any member).  The failure policy counts attempts by it.
        self.delivery_count = delivery_count
        self._nack_delay_ms: int | None = None
        self._effects: Effects | None = None

    # -- data ----------------------------------------------------------------

    @property
    def id(self) -> str:
        """The stream entry id, e.g. ``"1700000000000-0"``."""
        return self._raw_id.decode()

    @property
    def raw_id(self) -> bytes:
        return self._raw_id

    @property
    def raw_fields(self) -> dict[bytes, bytes]:
        """The entry's fields exactly as Redis returned them."""
        return self._raw_fields

    @property
    def fields(self) -> dict[str, str]:
        """The fields decoded as UTF-8 (decoded once, on first access).

        Raises ``UnicodeDecodeError`` for binary values: use ``raw_fields``.
        """
        if self._fields is None:
            self._fields = {k.decode(): v.decode() for k, v in self._raw_fields.items()}
        return self._fields

    @property
    def stream_key(self) -> str:
        return self._sink.stream_key

    @property
    def consumer_group(self) -> str:
        return self._sink.consumer_group

    @property
    def member_id(self) -> str:
        """The member (and Redis consumer) that read this message."""
        return self._sink.member_id

    @property
    def attempt(self) -> int:
        """This delivery's number, from 1 (the same as ``delivery_count``)."""
        return self.delivery_count

    @property
    def settled(self) -> Settlement | None:
        return self._settled

    @property
    def idempotency_id(self) -> str:
        """The publisher's idempotency id (field ``idempotency-id``), else the entry id."""
        given = self._raw_fields.get(b"idempotency-id") if self._raw_fields else None
        return (given or self._raw_id).decode()

    @property
    def effects(self) -> Effects:
        """Redis writes applied exactly once, with this entry's ack (idempotent
        listeners only): ``msg.effects.hincrby(msg.effects.key("totals"), "n", 1)``."""
        if self._settled is not None:
            raise RuntimeError(
                "stage effects before the message is acked: they commit with the ack"
            )
        if self._effects is None:
            make = getattr(self._sink, "effects", None)
            if getattr(self._sink, "idempotence", None) is None or make is None:
                raise RuntimeError(
                    "msg.effects needs an idempotent listener: declare it with idempotent=True"
                )
            self._effects = make()
        return self._effects

    def staged_effects(self) -> list[tuple[str, str, list[Any]]]:
        return [] if self._effects is None else list(self._effects.staged)

    # -- settlement -----------------------------------------------------------

    def ack(self) -> Awaitable[None]:
        """Acknowledge (``XACK``): the entry leaves the pending list.

        Takes effect when called: the id joins the shard's ack batch, which is
        sent after the current read batch is handled and before the shard is
        reported revoked.  A crash before that send means redelivery, which
        at-least-once allows.  Awaiting the result is optional.
        """
        return self._settle(Settlement.ACK)

    def ack_del(self) -> Awaitable[None]:
        """Acknowledge and delete the entry from the stream.

        ``XACKDEL`` where the server has it (Redis 8.2+); on older servers an
        ``XACK`` + ``XDEL`` in one ``MULTI`` on the shard key (a single slot, so
        it is valid in Redis Cluster too).
        """
        return self._settle(Settlement.ACK_DEL)

    def nack(self, delay: float | None = None) -> Awaitable[None]:
        """Give the message back: it stays pending and is delivered again.

        A nack is a failure without an exception: it goes through the
        listener's failure policy.  The redelivery comes after ``delay``
        seconds (None: the policy's backoff), counts as an attempt, and after
        the last attempt the entry is dead-lettered (or its shard halted).
        With ``ordered=True`` later entries of the shard wait for it.
        """
        if delay is not None:
            if delay < 0:
                raise ValueError(f"delay must be >= 0, got {delay!r}")
            if self._settled is None:
                self._nack_delay_ms = int(delay * 1000)
        return self._settle(Settlement.NACK)

    @property
    def nack_delay_ms(self) -> int | None:
        """The delay ``nack(delay=...)`` asked for, in ms (None: policy backoff)."""
        return self._nack_delay_ms

    def _settle(self, how: Settlement) -> Awaitable[None]:
        if self._settled is None:
            self._settled = how
            if how is not Settlement.NACK and getattr(self._sink, "idempotence", None) is not None:
                self._sink.commit(self, how)  # type: ignore[attr-defined]
            else:
                self._sink.settle(self._raw_id, how)
        return _DONE

    def __repr__(self) -> str:
        return f"<Message {self.stream_key} {self.id} member={self.member_id}>"
