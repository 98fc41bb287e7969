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
    # One pass over members and one over shards: the tick loop computes this
    # for every group every second (``GroupMetadata.revoking_from`` and
    # ``pending_for`` per member would cost members x shards).
    live = {m for m, meta in group.members.items() if meta.live}
    oldest = min((group.members[m].last_heartbeat_ms for m in live), default=now_ms)
    revoking_owners: set[str] = set()
    revoking = pending = 0
    target = group.target
    for shard, owner in group.owners.items():
        if owner in live and target.get(shard) != owner:
            revoking += 1
            revoking_owners.add(owner)
    owners = group.owners
    for shard, wanted in target.items():
        if wanted in live and owners.get(shard) != wanted:
            pending += 1
    return GroupGauges(
        heartbeat_age_seconds=max(0, now_ms - oldest) / 1000,
        revoke_pending=len(revoking_owners),
        revoking_shards=revoking,
        pending_shards=pending,
    )
