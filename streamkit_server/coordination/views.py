"""Pure functions from a ``GroupMetadata`` (and Redis facts) to wire responses.

No I/O here: the API layer loads, these functions shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streamkit.protocol import (
    AssignmentsResponse,
    ConsumerShardProgress,
    ConsumptionProgressResponse,
    GroupResponse,
    MemberView,
    Migration,
    ProducerRoutingResponse,
    ProducerRoutingShard,
    StreamScaleResponse,
    StreamShardOffset,
    StreamShardOffsetsResponse,
    shard_ids,
)
from streamkit.routing import redis_cluster_slot, stream_key
from streamkit_server.core import GroupMetadata, MigrationRecord, invariant_violations

__all__ = [
    "ShardFacts",
    "assignments",
    "consumption",
    "group_response",
    "invariant_violations",
    "member_views",
    "migration",
    "migrations",
    "producer_routing",
    "shard_offsets",
    "stream_scale",
]


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def migration(record: MigrationRecord) -> dict[str, Any]:
    """A ``Migration`` with the progress an operator needs, as wire JSON.

    The contract's ``Migration`` has six properties and allows more; the
    extra ones say where the migration stands (which shards it added and
    removed, which are retired) and how it was asked for.
    """
    return {
        **_migration(record).to_wire(),
        "requestedBy": record.requested_by,
        "reason": record.reason,
        "ordering": "key" if record.ordered else "none",
        "switchedAt": _iso(record.switched_at_ms),
        "previousLayout": record.previous_layout,
        "newLayout": record.new_layout,
        "addedShards": record.added_shards,
        "removedShards": record.removed_shards,
        "retiredShards": record.retired_shards,
    }


def _iso(ms: int | None) -> str | None:
    value = _dt(ms)
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _migration(record: MigrationRecord) -> Migration:
    return Migration(
        resharding_id=record.resharding_id,
        from_shard_count=record.from_shard_count,
        to_shard_count=record.to_shard_count,
        state=record.state,
        created_at=_dt(record.created_at_ms),
        updated_at=_dt(record.updated_at_ms),
    )


def _count_by_member(mapping: Mapping[int, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for member in mapping.values():
        counts[member] = counts.get(member, 0) + 1
    return dict(sorted(counts.items()))


def _shards_by_member(shards: Mapping[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for shard, member in sorted(shards.items()):
        out.setdefault(member, []).append(shard)
    return dict(sorted(out.items()))


def group_response(group: GroupMetadata) -> GroupResponse:
    active = group.active_migration()
    return GroupResponse(
        stream_prefix=group.stream_prefix,
        consumer_group=group.consumer_group,
        state=group.state,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        metadata_version=group.metadata_version,
        shard_count=group.shard_count,
        active_migration=_migration(active) if active is not None else None,
        target_assignment_summary=_count_by_member(group.target),
        current_assignment_summary=_count_by_member(group.owners),
    )


def member_views(group: GroupMetadata, now_ms: int) -> list[MemberView]:
    views = []
    for member_id, member in sorted(group.members.items()):
        views.append(
            MemberView(
                member_id=member_id,
                member_name=member.member_name,
                state=member.state,
                member_epoch=member.member_epoch,
                current_assignment=shard_ids(group.assigned_to(member_id)),
                revoking=shard_ids(group.revoking_from(member_id)),
                # Additional properties (the contract allows them): what an
                # operator needs when triaging a stuck rebalance.
                pendingShards=shard_ids(group.pending_for(member_id)),
                heartbeatAgeMs=max(0, now_ms - member.last_heartbeat_ms),
                lastReportedMetadataVersion=member.last_reported_version,
                runtimeMaxConcurrency=member.runtime_max_concurrency,
                availableConcurrency=member.available_concurrency,
                revokeDeadlineAt=_dt(member.revoke_deadline_ms),
            )
        )
    return views


def assignments(group: GroupMetadata) -> AssignmentsResponse:
    current: dict[str, list[int]] = {}
    revoking: dict[str, list[int]] = {}
    for member_id in sorted(set(group.owners.values())):
        held = group.assigned_to(member_id)
        if held:
            current[member_id] = held
        draining = group.revoking_from(member_id)
        if draining:
            revoking[member_id] = draining
    return AssignmentsResponse(
        target_assignment={m: shard_ids(s) for m, s in _shards_by_member(group.target).items()},
        current_assignments={m: shard_ids(s) for m, s in current.items()},
        revoke_progress={m: shard_ids(s) for m, s in revoking.items()},
        invariant_violations=invariant_violations(group),
    )


def consumption(group: GroupMetadata) -> ConsumptionProgressResponse:
    rows = []
    for member_id, member in sorted(group.members.items()):
        for shard, progress in sorted(member.progress.items()):
            rows.append(
                ConsumerShardProgress(
                    stream_prefix=group.stream_prefix,
                    consumer_group=group.consumer_group,
                    member_id=member_id,
                    member_name=member.member_name,
                    member_state=member.state,
                    shard=shard_ids([shard])[0],
                    stream_key=progress.stream_key or stream_key(group.stream_prefix, shard),
                    last_delivered_id=progress.last_delivered_id,
                    last_acked_id=progress.last_acked_id,
                    pending_count=progress.pending_count,
                    updated_at=_dt(progress.updated_at_ms),
                )
            )
    return ConsumptionProgressResponse(progress=rows)


def migrations(group: GroupMetadata) -> dict[str, Any]:
    """``MigrationsResponse`` as wire JSON, each migration with its progress."""
    active = group.active_migration()
    return {
        "migrations": [migration(m) for m in group.migrations],
        "activeReshardingId": active.resharding_id if active is not None else None,
    }


def stream_scale(
    stream_prefix: str, target: int, groups: Mapping[str, GroupMetadata], resharding_id: str
) -> dict[str, Any]:
    """``StreamScaleResponse`` as wire JSON (migrations with their progress)."""
    records = [
        next(m for m in group.migrations if m.resharding_id == resharding_id)
        for _, group in sorted(groups.items())
    ]
    body = StreamScaleResponse(
        stream_prefix=stream_prefix,
        target_shard_count=target,
        affected_consumer_groups=sorted(groups),
        migrations=[],
    ).to_wire()
    body["migrations"] = [migration(m) for m in records]
    return body


def producer_routing(group: GroupMetadata) -> ProducerRoutingResponse:
    """Routing index ``i`` goes to physical shard ``layout[i]``.

    ``streamKeyPattern`` stays ``{prefix}:{shardIndex}`` (the contract's
    shape), which matches only the identity layout; after an ordered reshard
    the shards have fresh ids, so clients must use each ``streamKey``.
    """
    shards = []
    for index, shard in enumerate(group.layout):
        key = stream_key(group.stream_prefix, shard)
        shards.append(
            ProducerRoutingShard(
                shard_index=index, stream_key=key, redis_slot=redis_cluster_slot(key)
            )
        )
    return ProducerRoutingResponse(
        stream_prefix=group.stream_prefix,
        consumer_group=group.consumer_group,
        metadata_version=group.metadata_version,
        shard_count=group.shard_count,
        stream_key_pattern=f"{group.stream_prefix}:{{shardIndex}}",
        shards=shards,
    )


@dataclass(frozen=True, slots=True)
class ShardFacts:
    """What Redis reported about one shard stream (None: unknown or absent)."""

    shard: int
    exists: bool
    length: int
    first_id: str | None
    last_id: str | None
    group_last_delivered_id: str | None
    group_pending: int | None
    group_lag: int | None
    memory_bytes: int | None
    node_endpoint: str | None


def _known_sum(values: Sequence[int | None]) -> int | None:
    """The sum, or None when one value is unknown: null never means zero."""
    return None if None in values else sum(v for v in values if v is not None)


def shard_offsets(group: GroupMetadata, facts: Sequence[ShardFacts]) -> StreamShardOffsetsResponse:
    rows = []
    for fact in facts:
        key = stream_key(group.stream_prefix, fact.shard)
        holder = group.owners.get(fact.shard)
        rows.append(
            StreamShardOffset(
                shard=shard_ids([fact.shard])[0],
                stream_key=key,
                redis_slot=redis_cluster_slot(key),
                redis_node_endpoint=fact.node_endpoint,
                stream_length=fact.length,
                first_record_id=fact.first_id,
                last_record_id=fact.last_id,
                group_last_delivered_id=fact.group_last_delivered_id,
                pending_count=fact.group_pending or 0,
                lag=fact.group_lag,
                memory_usage_bytes=fact.memory_bytes,
                owner_member_ids=[holder] if holder is not None else [],
            )
        )
    memory = [fact.memory_bytes for fact in facts]
    return StreamShardOffsetsResponse(
        stream_prefix=group.stream_prefix,
        consumer_group=group.consumer_group,
        shards=rows,
        total_stream_length=sum(fact.length for fact in facts),
        total_pending_count=sum(fact.group_pending or 0 for fact in facts),
        total_lag=_known_sum([fact.group_lag for fact in facts]),
        # The known part, flagged: a partial memory total is still worth showing.
        total_memory_usage_bytes=sum(m for m in memory if m is not None),
        memory_usage_known=None not in memory,
    )
