"""Upper bounds on what a client may ask for, so no request makes the
coordinator work (or hold a group's lock) for more than a bounded time.

Each bound is documented (docs/api.md, docs/operations.md) and refused with
a 400 ``ErrorResponse`` by the HTTP layer.
"""

from __future__ import annotations

from typing import Final

from streamkit.protocol import HeartbeatRequest

from .config import CoordinatorConfig
from .model import GroupMetadata

__all__ = ["MAX_SHARD_COUNT", "RECORDS_PER_MEMBER_SLOT", "evictable_records", "join_refusal"]

#: Shards of one stream, for ``initialShardCount`` and ``targetShardCount``
#: alike.  Creating or scaling provisions one Redis stream per shard while the
#: stream's lock is held (its TTL is a few seconds), and every heartbeat of the
#: group loads the layout: 4096 shards provision in about 1.5 s on a loaded
#: 2-core machine, 65536 took more than a minute.
MAX_SHARD_COUNT: Final = 4_096

#: Records of departed members stay for a retention period; with churn they
#: may outnumber the live ones, but not without bound.
RECORDS_PER_MEMBER_SLOT: Final = 4


def join_refusal(
    group: GroupMetadata, member_id: str, request: HeartbeatRequest, config: CoordinatorConfig
) -> str | None:
    """Why a heartbeat may not add ``member_id`` to ``group`` (None: it may)."""
    if request.member_epoch != 0:
        return None
    existing = group.members.get(member_id)
    if existing is not None and existing.live:
        return None  # a retried join adds nobody
    limit = config.max_members_per_group
    live = sum(1 for m in group.members.values() if m.live)
    if live >= limit:
        return f"the group already has {live} live members; at most {limit} are allowed"
    cap = RECORDS_PER_MEMBER_SLOT * limit
    if existing is None and len(group.members) >= cap and not evictable_records(group):
        # Every departed record still holds a shard (a fenced member inside
        # its lease, a drain after a rollback): room comes within one lease.
        return (
            f"the group holds {len(group.members)} member records and every departed "
            f"member among them may still be reading; at most {cap} are kept, retry "
            "after one member lease"
        )
    return None


def evictable_records(group: GroupMetadata) -> list[str]:
    """Departed members' records a join may drop before their retention ends.

    A record is kept after its member left so that a late report of it is
    recognised (and fenced) instead of starting a new member.  Dropping one
    that holds nothing is safe: a late report then gets UNKNOWN_MEMBER_ID and
    its sender stops reading all the same.  Records that hold a shard (fenced
    inside their lease) or may still drain one (after a rollback) are never
    dropped early.  Oldest departure first, so churn evicts churn.
    """
    candidates = [
        m
        for m in group.members.values()
        if not m.live
        and m.dead_since_ms is not None
        and not m.draining_unrecorded
        and not group.shards_held_by(m.member_id)
    ]
    candidates.sort(key=lambda m: (m.dead_since_ms or 0, m.member_id))
    return [m.member_id for m in candidates]
