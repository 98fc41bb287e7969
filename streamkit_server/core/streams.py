"""Stream-wide rules: the stream record, the common layout, and what a group create may ask.

The shard streams of a prefix are shared by all of its consumer groups, so
these decisions are per stream.  ``StreamRecord`` is the stream's record
(``{kp}:{<prefix>}:stream``, see ``store/streams.py``): which physical shards
it routes to, whether scales keep per-key order, which groups it has.  The
group metadata stays the source of truth; the record follows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal, TypeAlias

from .errors import Rejected
from .model import GroupMetadata
from .retention import RetentionPolicy

__all__ = [
    "ORDERINGS",
    "Ordering",
    "StreamChoices",
    "StreamRecord",
    "common_layout",
    "create_group_layout",
    "record_with_group",
    "record_without_group",
    "refuse_active",
    "refuse_existing_stream",
    "synced_record",
]

Ordering: TypeAlias = Literal["none", "key"]
ORDERINGS: Final[tuple[Ordering, ...]] = ("none", "key")


@dataclass(frozen=True, slots=True)
class StreamChoices:
    """What a create may choose for its stream besides the shard count (None: not chosen)."""

    ordering: Ordering | None = None
    retention: RetentionPolicy | None = None


@dataclass(frozen=True, slots=True)
class StreamRecord:
    layout: tuple[int, ...]
    ordering: Ordering = "none"
    groups: tuple[str, ...] = ()
    #: The stream's own retention (``core/retention.py``); None: none of its own
    #: (records written before retention existed read as None).
    retention: RetentionPolicy | None = None

    @property
    def shard_count(self) -> int:
        return len(self.layout)

    @classmethod
    def parse(cls, raw: Mapping[str, str], stream_prefix: str) -> StreamRecord:
        """Read a record; records written before layouts existed are the identity."""
        try:
            count = int(raw["shardCount"])
            layout = json.loads(raw["layout"]) if "layout" in raw else list(range(count))
            ordering = raw.get("ordering") or "none"
            groups = json.loads(raw.get("groups") or "[]")
            valid = (
                isinstance(layout, list)
                and len(layout) == count
                and all(isinstance(s, int) and s >= 0 for s in layout)
                and ordering in ORDERINGS
                and isinstance(groups, list)
                and all(isinstance(g, str) for g in groups)
            )
            raw_retention = raw.get("retention") or ""
            retention = RetentionPolicy.from_field(raw_retention) if raw_retention else None
        except (KeyError, ValueError):
            valid = False
        if not valid:
            raise Rejected(
                "METADATA_CORRUPT",
                f"stream layout record of {stream_prefix!r} is unreadable "
                "(shardCount/layout/ordering/groups/retention); repair it from the group "
                "metadata",
            )
        return cls(tuple(layout), "key" if ordering == "key" else "none", tuple(groups), retention)

    def layout_fields(self) -> dict[str, str]:
        return {
            "shardCount": str(self.shard_count),
            "layout": json.dumps(list(self.layout)),
            "ordering": self.ordering,
        }

    def groups_field(self) -> dict[str, str]:
        return {"groups": json.dumps(sorted(set(self.groups)))}

    def retention_field(self) -> dict[str, str]:
        """Written only when set: an absent field is what older records have too."""
        return {} if self.retention is None else {"retention": self.retention.to_field()}


def common_layout(stream_prefix: str, groups: Iterable[GroupMetadata]) -> tuple[int, ...] | None:
    """The layout every group routes to (None without groups).

    All groups of a stream switch together, so differing layouts mean a
    stream-wide change was interrupted in a way the coordinator cannot repair
    on its own; refuse rather than guess which one producers use.
    """
    layouts = {tuple(g.layout) for g in groups}
    if len(layouts) > 1:
        raise Rejected(
            "LAYOUT_DIVERGED",
            f"the consumer groups of stream {stream_prefix!r} route to different shard "
            f"layouts ({sorted(layouts)}); repair the group metadata before changing the stream",
        )
    return layouts.pop() if layouts else None


def refuse_existing_stream(stream_prefix: str, exists: bool) -> None:
    if exists:
        raise Rejected("STREAM_ALREADY_EXISTS", f"stream {stream_prefix!r} already exists")


def refuse_active(
    stream_prefix: str,
    groups: Iterable[GroupMetadata],
    advice: str = "wait for it to end or roll it back",
) -> None:
    """Refuse while a group of the stream is migrating (a scale, a new group)."""
    for group in groups:
        active = group.active_migration()
        if active is not None:
            raise Rejected(
                "ACTIVE_MIGRATION_EXISTS",
                f"stream {stream_prefix!r} is being resharded ({active.resharding_id}, "
                f"{active.state.value}, group {group.consumer_group!r}); {advice}",
            )


def create_group_layout(
    stream_prefix: str,
    record: StreamRecord | None,
    others: Iterable[GroupMetadata],
    initial_shard_count: int | None,
    default_shard_count: int,
    ordering: Ordering | None,
) -> tuple[list[int], bool]:
    """The layout a new group of the stream starts on, and whether it is a new one.

    A new layout (no group and no record yet) must first be checked for shard
    keys that already hold data.  Refuses a create during a migration of the
    other groups, a shard count other than the stream's, and an ordering other
    than the record's.
    """
    others = list(others)
    # The new group would miss the migration the others are in.
    refuse_active(stream_prefix, others, "create the group once it has finished")
    # The groups are the source of truth for the layout; the record only
    # matters for a stream that has none (yet).
    current = common_layout(stream_prefix, others)
    if current is None and record is not None:
        current = record.layout
    if current is not None:
        if initial_shard_count is not None and initial_shard_count != len(current):
            raise Rejected(
                "SHARD_COUNT_MISMATCH",
                f"stream {stream_prefix!r} has {len(current)} shards; initialShardCount="
                f"{initial_shard_count} does not match (omit it, or scale the stream)",
            )
        layout, fresh = list(current), False
    else:
        layout, fresh = list(range(initial_shard_count or default_shard_count)), True
    if record is not None and ordering is not None and ordering != record.ordering:
        raise Rejected(
            "ORDERING_MISMATCH",
            f"stream {stream_prefix!r} has ordering={record.ordering!r}; the group cannot "
            f"ask for {ordering!r} (omit it; an ordering given to a scale request "
            "applies to that scale only)",
        )
    return layout, fresh


def record_with_group(
    record: StreamRecord | None,
    layout: Iterable[int],
    ordering: Ordering | None,
    group: str,
    retention: RetentionPolicy | None = None,
) -> StreamRecord:
    """The record once ``group`` is created on ``layout`` (named before its metadata exists).

    A ``retention`` given with the create replaces the stream's; without one
    the stream keeps its own.
    """
    return StreamRecord(
        tuple(layout),
        record.ordering if record else ordering or "none",
        (*(record.groups if record else ()), group),
        retention if retention is not None else record.retention if record else None,
    )


def record_without_group(record: StreamRecord | None, group: str) -> StreamRecord | None:
    """The record once ``group`` is deleted; None when it does not name the group."""
    if record is None or group not in record.groups:
        return None
    return replace(record, groups=tuple(g for g in record.groups if g != group))


def synced_record(
    stream_prefix: str, groups: Iterable[GroupMetadata], record: StreamRecord | None
) -> StreamRecord | None:
    """The record that follows the groups' common layout; None when nothing changes."""
    layout = common_layout(stream_prefix, groups)
    if layout is None or (record is not None and record.layout == layout):
        return None
    if record is None:
        return StreamRecord(layout)
    return replace(record, layout=layout)
