"""The periodic tick: lease expiry, rebalance-timeout fencing, clean-up."""

from __future__ import annotations

from .config import CoordinatorConfig
from .draft import Draft
from .model import GroupMetadata
from .resharding import advance_migration


def tick(group: GroupMetadata, now_ms: int, config: CoordinatorConfig) -> GroupMetadata:
    """Apply every timeout due at ``now_ms``.

    Returns ``group`` itself when nothing is due, so the caller can skip the
    write (``next_group is group``).
    """
    draft = Draft(group, now_ms, config)
    draft.apply_timeouts()
    advance_migration(draft)
    return draft.finish()


def next_deadline_ms(group: GroupMetadata, config: CoordinatorConfig) -> int | None:
    """The earliest time at which ``tick`` would change something, if any.

    Lets the server's loop skip loading groups that have nothing due.
    """
    deadlines: list[int] = []
    for member in group.members.values():
        if member.live:
            deadlines.append(member.last_heartbeat_ms + config.member_lease_ttl_ms + 1)
            if member.revoke_deadline_ms is not None:
                deadlines.append(member.revoke_deadline_ms + 1)
        elif member.fenced_at_ms is not None and group.shards_held_by(member.member_id):
            deadlines.append(member.fenced_at_ms + config.member_lease_ttl_ms)
        elif member.dead_since_ms is not None:
            deadlines.append(member.dead_since_ms + config.dead_member_retention_ms + 1)
    migration = group.active_migration()
    if migration is not None:
        # A migration waits on Redis work (provisioning, drain probes) that only
        # the server's loop can do: keep it due while the migration is open.
        deadlines.append(migration.updated_at_ms)
    if group.correction is not None:
        deadlines.append(group.correction.started_at_ms + config.member_lease_ttl_ms)
    return min(deadlines) if deadlines else None


def begin_correction(
    group: GroupMetadata, now_ms: int, config: CoordinatorConfig, reported_version: int
) -> GroupMetadata:
    """Open a metadata correction round without a client asking for it.

    For a coordinator process that notices on its own that Redis went back
    (it loaded a lower revision than it wrote): the same round a member's
    higher metadataVersion would open, so grants wait out forgotten leases.
    """
    draft = Draft(group, now_ms, config)
    draft.open_correction(reported_version)
    return draft.finish()
