"""When a timeout could next change a group: the one rule both the draft
(bounding what it writes) and the server's loop (skipping groups with
nothing due) ask."""

from __future__ import annotations

from .config import CoordinatorConfig
from .model import GroupMetadata

__all__ = ["earliest_deadline_ms"]


def earliest_deadline_ms(group: GroupMetadata, config: CoordinatorConfig) -> int | None:
    """The earliest time at which a timeout could change ``group``, if any."""
    deadlines: list[int] = []
    ttl = config.member_lease_ttl_ms
    for member in group.members.values():
        if member.live:
            deadlines.append(member.last_heartbeat_ms + ttl + 1)
            if member.revoke_deadline_ms is not None:
                deadlines.append(member.revoke_deadline_ms + 1)
        elif member.fenced_at_ms is not None and group.shards_held_by(member.member_id):
            deadlines.append(member.fenced_at_ms + ttl)
        elif member.dead_since_ms is not None:
            deadlines.append(member.dead_since_ms + config.dead_member_retention_ms + 1)
    migration = group.active_migration()
    if migration is not None:
        # A migration waits on Redis work (provisioning, drain probes) that only
        # the server's loop can do: keep it due while the migration is open.
        deadlines.append(migration.updated_at_ms)
    if group.correction is not None:
        deadlines.append(group.correction.started_at_ms + ttl)
    return min(deadlines) if deadlines else None
