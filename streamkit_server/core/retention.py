"""Retention that respects the consumer groups: what a shard may be trimmed to (sans-IO).

A stream's retention (``RetentionPolicy``: by age and/or by length) says which
entries the operator no longer wants.  The groups say which entries are still
needed: for every consumer group on the shard stream, every entry after its
``last-delivered-id`` is unread and every pending entry is unfinished.  The
coordinator trims a shard with ``XTRIM MINID`` up to the *older* of the two,
so a slow or stopped group makes retention wait instead of dropping its work
(``blocked``), and the wait is reported.

The rules here are the specification; the Lua script that applies them
(``store/scripts.py`` ``RETAIN``) does the same on the live stream in one
atomic step, and ``tests/server/store/test_retention_script.py`` checks that
the two agree.

Stream ids are ``(ms, seq)`` tuples here.  The floor of a group keeps its last
delivered entry too (``MINID`` = the last-delivered id): one entry more than
strictly needed, in exchange for no "successor id" arithmetic that Lua's
doubles could get wrong for huge sequence numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from streamkit.protocol.durations import format_duration

from .errors import Rejected

__all__ = [
    "MAX_RETENTION_AGE_MS",
    "MAX_RETENTION_LENGTH",
    "GroupPosition",
    "RetentionPolicy",
    "StreamId",
    "TrimPlan",
    "age_min_id",
    "format_duration",
    "format_id",
    "group_floor",
    "parse_id",
    "plan_trim",
    "policy_from_wire",
]

StreamId: TypeAlias = tuple[int, int]

#: Bounds of a policy (a typo such as ``--max-age 7000d`` is refused, not obeyed).
MAX_RETENTION_AGE_MS: Final = 3650 * 86_400_000
MAX_RETENTION_LENGTH: Final = 2**53


def parse_id(text: str) -> StreamId:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(stream_id: StreamId) -> str:
    return f"{stream_id[0]}-{stream_id[1]}"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Trim entries older than ``max_age_ms`` and/or beyond the newest ``max_length``.

    Both None is an explicit "no retention" (it overrides the coordinator's
    default).  Stored in the stream record as the JSON field ``retention``;
    a record without it has no retention of its own.
    """

    max_age_ms: int | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.max_age_ms is not None and not 1 <= self.max_age_ms <= MAX_RETENTION_AGE_MS:
            raise Rejected(
                "INVALID_RETENTION",
                f"maxAgeMs must be 1..{MAX_RETENTION_AGE_MS} (ten years), got {self.max_age_ms}",
            )
        if self.max_length is not None and not 1 <= self.max_length <= MAX_RETENTION_LENGTH:
            raise Rejected(
                "INVALID_RETENTION",
                f"maxLength must be 1..{MAX_RETENTION_LENGTH}, got {self.max_length}",
            )

    @property
    def enabled(self) -> bool:
        return self.max_age_ms is not None or self.max_length is not None

    def to_wire(self) -> dict[str, int | None]:
        return {"maxAgeMs": self.max_age_ms, "maxLength": self.max_length}

    def to_field(self) -> str:
        return json.dumps({k: v for k, v in self.to_wire().items() if v is not None})

    @classmethod
    def from_field(cls, raw: str) -> RetentionPolicy:
        """The stored field; ValueError when it is not one."""
        data: Any = json.loads(raw)
        if not isinstance(data, dict) or set(data) - {"maxAgeMs", "maxLength"}:
            raise ValueError("retention must be an object with maxAgeMs/maxLength")
        values = [data.get("maxAgeMs"), data.get("maxLength")]
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
            raise ValueError("maxAgeMs/maxLength must be integers")
        try:
            return cls(values[0], values[1])
        except Rejected as exc:
            raise ValueError(exc.message) from None

    def describe(self) -> str:
        parts = []
        if self.max_age_ms is not None:
            parts.append(f"max age {format_duration(self.max_age_ms)}")
        if self.max_length is not None:
            parts.append(f"max length {self.max_length}")
        return ", ".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """One consumer group on a shard stream, as ``XINFO GROUPS`` / ``XPENDING`` show it."""

    name: str
    last_delivered: StreamId
    #: The smallest pending id; None when nothing is pending.
    pending_min: StreamId | None = None


def group_floor(
    groups: Iterable[GroupPosition], expected: Iterable[str] = (), empty: bool = False
) -> tuple[StreamId | None, str | None]:
    """The oldest id some group still needs, and the group that needs it.

    (None, None): no group holds anything back.  A coordinator group
    (``expected``) without its Redis group on a non-empty shard never read the
    shard: nothing may be trimmed for it (floor ``(0, 0)``).
    """
    floor: StreamId | None = None
    holder: str | None = None
    seen = set()
    for g in groups:
        seen.add(g.name)
        need = g.last_delivered if g.pending_min is None else min(g.last_delivered, g.pending_min)
        if floor is None or need < floor:
            floor, holder = need, g.name
    if not empty:
        for name in sorted(set(expected) - seen):
            return (0, 0), name
    return floor, holder


def age_min_id(max_age_ms: int, now_ms: int) -> StreamId:
    """``<now - maxAge>-0``: entries older than the age are below it."""
    return max(0, now_ms - max_age_ms), 0


@dataclass(frozen=True, slots=True)
class TrimPlan:
    #: What the policy alone would trim below (None: nothing).
    wanted: StreamId | None
    #: What may be trimmed below: ``wanted`` held back by the groups.
    min_id: StreamId | None
    #: The policy wanted more than the groups allow.
    blocked: bool
    #: The group holding retention back (when blocked).
    blocking_group: str | None = None


def plan_trim(
    policy: RetentionPolicy,
    now_ms: int,
    length_cutoff: StreamId | None,
    floor: StreamId | None,
    holder: str | None = None,
) -> TrimPlan:
    """Where to trim a shard.

    ``length_cutoff``: the id at position ``len - maxLength`` (the oldest entry
    the length rule keeps; None when the stream is not longer than that).  The
    age and length rules combine to the one that trims more (the larger id);
    the groups' ``floor`` (``group_floor``) caps it.
    """
    wanted: StreamId | None = None
    if policy.max_age_ms is not None:
        wanted = age_min_id(policy.max_age_ms, now_ms)
    if policy.max_length is not None and length_cutoff is not None:
        wanted = length_cutoff if wanted is None else max(wanted, length_cutoff)
    if wanted is None:
        return TrimPlan(None, None, False)
    if floor is not None and floor < wanted:
        return TrimPlan(wanted, floor, True, holder)
    return TrimPlan(wanted, wanted, False)


def policy_from_wire(data: Mapping[str, Any] | None) -> RetentionPolicy | None:
    """``{"maxAgeMs": .., "maxLength": ..}`` of a request body (already type-checked)."""
    if data is None:
        return None
    return RetentionPolicy(data.get("maxAgeMs"), data.get("maxLength"))
