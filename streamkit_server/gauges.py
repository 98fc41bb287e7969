"""Per-group alert gauges computed from group metadata (pure: ``now`` injected).

One label set per group (stream prefix, consumer group), never per member or
shard, so the series count is bounded by the number of groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamkit_server.core.model import GroupMetadata

__all__ = ["GroupGauges", "group_gauges"]


@dataclass(frozen=True, slots=True)
class GroupGauges:
    # The oldest last heartbeat among live members (0 without live members).
    heartbeat_age_seconds: float
    # Live members holding a shard they were asked to give up.
    revoke_pending: int
    # Shards held by a member other than their target owner.
    revoking_shards: int
    # Target shards their new owner may not read yet (waiting for a revoke).
    pending_shards: int


def group_gauges(group: GroupMetadata, now_ms: int) -> GroupGauges:
    live = [group.members[m] for m in group.live_member_ids()]
    oldest = min((m.last_heartbeat_ms for m in live), default=now_ms)
    revoking = {m: group.revoking_from(m) for m in group.live_member_ids()}
    pending = sum(len(group.pending_for(m)) for m in group.live_member_ids())
    return GroupGauges(
        heartbeat_age_seconds=max(0, now_ms - oldest) / 1000,
        revoke_pending=sum(1 for shards in revoking.values() if shards),
        revoking_shards=sum(len(shards) for shards in revoking.values()),
        pending_shards=pending,
    )
