"""Idempotent listeners: markers, fencing and staged effects (``idempotent=True``).

For a listener declared idempotent, every entry has an idempotency id: the
publisher's (field ``idempotency-id``, written by an idempotent publish) or
else its entry id.  Per shard and group, a *marker set* (a sorted set of ids
by the time they were committed, in the shard's cluster slot) records what
was handled:

* before the handler runs, ids already marked are acked without running it
  (a message published twice, or redelivered after a lost ack);
* after it succeeds, one script (``streamkit.scripts.COMMIT``) checks the
  shard's fencing token, writes the marker, applies the Redis writes the
  handler staged on ``msg.effects`` and acks the entry, all or nothing.

The fencing token is a counter in the shard's slot that every new reader of
the shard increments when it starts: a member that lost the shard (fenced,
lease expired, revoked while a handler ran) commits with an older token and
its whole commit is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from streamkit.errors import StreamkitError
from streamkit.publisher.idempotence import IDEMPOTENCY_FIELD
from streamkit.routing import redis_cluster_slot
from streamkit.scripts import slot_key

__all__ = [
    "Commit",
    "CommitCounts",
    "CrossSlotEffectError",
    "Effects",
    "Idempotence",
    "fence_key",
    "marker_key",
]

_FIELD: Final = IDEMPOTENCY_FIELD.encode()


class CrossSlotEffectError(StreamkitError, ValueError):
    """An effect key that cannot be committed with the entry's ack (another cluster slot)."""


@dataclass(frozen=True, slots=True)
class Idempotence:
    """How an idempotent listener keeps its markers (``idempotent=Idempotence(...)``).

    ``marker_ttl``: seconds a marker is kept at least (default one day): a
    duplicate arriving later runs the handler again.  ``max_markers``: at most
    this many per shard and group (default 200,000: about 23 MiB per shard
    and group at ~30-byte ids, docs/performance.md); beyond it the oldest go
    first, even inside ``marker_ttl``.
    """

    marker_ttl: float = 86_400.0
    max_markers: int = 200_000

    def __post_init__(self) -> None:
        if not self.marker_ttl > 0:
            raise ValueError(f"marker_ttl must be > 0 seconds, got {self.marker_ttl!r}")
        if (
            isinstance(self.max_markers, bool)
            or not isinstance(self.max_markers, int)
            or self.max_markers < 1
        ):
            raise ValueError(f"max_markers must be an integer >= 1, got {self.max_markers!r}")

    @staticmethod
    def id_of(entry_id: bytes, fields: Mapping[bytes, bytes] | None) -> bytes:
        """The entry's idempotency id: the publisher's, else its entry id."""
        if fields:
            given = fields.get(_FIELD)
            if given:
                return given
        return entry_id


#: Names under ``{<shard key>}:`` that streamkit's own keys use.
RESERVED_EFFECT_NAMES: Final = ("idem",)
RESERVED_EFFECT_PREFIXES: Final = ("idem:", "done:", "fence:")


def marker_key(stream_key: str, group: str) -> str:
    return slot_key(stream_key, f"done:{group}")


def fence_key(stream_key: str, group: str) -> str:
    return slot_key(stream_key, f"fence:{group}")


@dataclass(slots=True)
class CommitCounts:
    """A member's idempotent-listener counters (metrics)."""

    #: Entries acked without running the handler, or whose effects were
    #: skipped, because their marker existed.
    duplicates_skipped: int = 0
    #: Commits refused because a newer reader took the shard (nothing applied).
    fenced: int = 0


@dataclass(slots=True)
class Commit:
    """One entry's marker + ack (+ delete) + staged effects, sent as one script."""

    entry_id: bytes
    idempotency_id: bytes
    delete: bool = False
    #: (command, key, arguments) staged by the handler.
    effects: list[tuple[str, str, list[Any]]] = field(default_factory=list)


class Effects:
    """Redis writes a handler stages, applied exactly once with the entry's ack.

    Nothing is sent when a method is called: the writes go out with the
    marker and the ``XACK`` in one script once the handler succeeded, and
    not at all if it fails, the member was fenced, or the entry's marker
    exists.  On a Redis Cluster every key must be in the shard's slot:
    build keys with :meth:`key`.
    """

    __slots__ = ("_cluster", "_slot", "_stream_key", "staged")

    def __init__(self, stream_key: str, *, cluster: bool) -> None:
        self._stream_key = stream_key
        self._cluster = cluster
        self._slot = redis_cluster_slot(stream_key) if cluster else -1
        self.staged: list[tuple[str, str, list[Any]]] = []

    def key(self, name: str) -> str:
        """A key for effects of this shard: ``{<shard key>}:<name>`` (its slot).

        A counter kept this way is per shard: sum it over the shards.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if name in RESERVED_EFFECT_NAMES or name.startswith(RESERVED_EFFECT_PREFIXES):
            # These are streamkit's own keys in the shard's slot (the publish
            # dedup record, the markers, the fence): an effect must not write them.
            raise ValueError(
                f"effect key name {name!r} is reserved (streamkit keeps "
                f"{', '.join(RESERVED_EFFECT_NAMES + RESERVED_EFFECT_PREFIXES)}… there); "
                "choose another name"
            )
        return slot_key(self._stream_key, name)

    def _stage(self, command: str, key: str, *args: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"effect keys are str, got {type(key).__name__}: {key!r}")
        if self._cluster and redis_cluster_slot(key) != self._slot:
            raise CrossSlotEffectError(
                f"effect key {key!r} is in cluster slot {redis_cluster_slot(key)}, but "
                f"{self._stream_key} is in slot {self._slot}: a commit is one script on one "
                f"slot. Build the key with msg.effects.key({key!r})."
            )
        for arg in args:
            if isinstance(arg, bool) or not isinstance(arg, str | bytes | int | float):
                raise TypeError(f"effect {command} {key!r}: cannot send {arg!r}")
        self.staged.append((command, key, list(args)))

    # -- hashes --------------------------------------------------------------------
    def hincrby(self, key: str, field: str, amount: int = 1) -> None:
        self._stage("HINCRBY", key, field, int(amount))

    def hincrbyfloat(self, key: str, field: str, amount: float) -> None:
        self._stage("HINCRBYFLOAT", key, field, float(amount))

    def hset(self, key: str, mapping: Mapping[str, Any]) -> None:
        if not mapping:
            raise ValueError("hset needs at least one field")
        self._stage("HSET", key, *(x for pair in mapping.items() for x in pair))

    def hdel(self, key: str, *fields: str) -> None:
        self._stage("HDEL", key, *fields)

    # -- strings -------------------------------------------------------------------
    def incrby(self, key: str, amount: int = 1) -> None:
        self._stage("INCRBY", key, int(amount))

    def incrbyfloat(self, key: str, amount: float) -> None:
        self._stage("INCRBYFLOAT", key, float(amount))

    def set(self, key: str, value: str | bytes | int | float, *, px: int | None = None) -> None:
        if px is None:
            self._stage("SET", key, value)
        else:
            self._stage("SET", key, value, "PX", int(px))

    def delete(self, key: str) -> None:
        self._stage("DEL", key)

    def pexpire(self, key: str, ms: int) -> None:
        self._stage("PEXPIRE", key, int(ms))

    # -- sets, sorted sets, lists, streams --------------------------------------------
    def sadd(self, key: str, *members: str | bytes) -> None:
        self._stage("SADD", key, *members)

    def srem(self, key: str, *members: str | bytes) -> None:
        self._stage("SREM", key, *members)

    def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        self._stage("ZADD", key, *(x for m, s in mapping.items() for x in (float(s), m)))

    def zincrby(self, key: str, amount: float, member: str) -> None:
        self._stage("ZINCRBY", key, float(amount), member)

    def zrem(self, key: str, *members: str) -> None:
        self._stage("ZREM", key, *members)

    def rpush(self, key: str, *values: str | bytes | int | float) -> None:
        self._stage("RPUSH", key, *values)

    def lpush(self, key: str, *values: str | bytes | int | float) -> None:
        self._stage("LPUSH", key, *values)

    def xadd(
        self,
        key: str,
        fields: Mapping[str, str | bytes | int | float],
        *,
        maxlen: int | None = None,
    ) -> None:
        """Append to a stream in the shard's slot (``MAXLEN ~ maxlen``)."""
        if not fields:
            raise ValueError("xadd needs at least one field")
        trim = () if maxlen is None else ("MAXLEN", "~", int(maxlen))
        self._stage("XADD", key, *trim, "*", *(x for pair in fields.items() for x in pair))
