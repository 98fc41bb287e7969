"""Group lifecycle rules: create, delete, and the invariants every stored group holds.

Pure like the rest of the core: each rule takes the stored group (``None``:
there is none) and returns a ``Result`` or raises ``Rejected`` with the wire's
error code; the executor applies it under the group's mutex.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import Rejected
from .model import GroupMetadata, new_group
from .result import GroupCreated, GroupDeleted, Result

__all__ = [
    "create_group",
    "delete_group",
    "group_already_exists",
    "group_not_found",
    "invariant_violations",
]


def group_not_found(stream_prefix: str, consumer_group: str) -> Rejected:
    return Rejected(
        "GROUP_NOT_FOUND",
        f"consumer group {consumer_group!r} of stream {stream_prefix!r} has no "
        f"coordinator metadata; create it with: streamkit group create {stream_prefix} "
        f"{consumer_group} (heartbeats never create or rebuild groups)",
    )


def group_already_exists(stream_prefix: str, consumer_group: str) -> Rejected:
    return Rejected(
        "GROUP_ALREADY_EXISTS",
        f"consumer group {consumer_group!r} of stream {stream_prefix!r} already exists",
    )


def create_group(
    group: GroupMetadata | None,
    stream_prefix: str,
    consumer_group: str,
    layout: Sequence[int],
    now_ms: int,
) -> Result[GroupMetadata]:
    """A new group on the stream's current ``layout``; answers the group created."""
    if group is not None:
        raise group_already_exists(stream_prefix, consumer_group)
    # The stream's current layout, which after an ordered reshard is not the identity.
    created = new_group(stream_prefix, consumer_group, len(layout), now_ms, layout)
    return Result(created, (GroupCreated(),), created)


def delete_group(
    group: GroupMetadata | None, stream_prefix: str, consumer_group: str, force: bool
) -> Result[GroupMetadata]:
    """Delete an inactive group (``force``: a live one too); answers it as it was."""
    if group is None:
        raise group_not_found(stream_prefix, consumer_group)
    if group.active_migration() is not None:
        # Its Redis consumer groups take part in the drain proof of the
        # migration's removed shards; deleting mid-way would strand it.
        raise Rejected(
            "ACTIVE_MIGRATION_EXISTS",
            "the group has an active resharding migration; wait for it to finish "
            "or roll it back, then delete",
        )
    live = group.live_member_ids()
    if (live or group.owners) and not force:
        raise Rejected(
            "GROUP_NOT_INACTIVE",
            f"group has {len(live)} live members and {len(group.owners)} held shards; "
            "let the members leave first, or pass force=true for recovery",
        )
    return Result(None, (GroupDeleted(),), group)


def invariant_violations(group: GroupMetadata) -> list[str]:
    """Checks that must hold for every stored group; empty when healthy.

    "A shard held by two members" cannot be represented (``owners`` maps each
    shard to one holder), so the checks are about holders and targets that are
    not allowed to be there.
    """
    problems: list[str] = []
    assignable = set(group.assignable_shards())
    # A removed shard proven drained stops being assignable while its holder
    # still has to revoke it: held, not targeted, and expected.
    active = group.active_migration()
    revocable = set(active.removed_shards) if active is not None else set()
    live = set(group.live_member_ids())
    for shard, holder in sorted(group.owners.items()):
        member = group.members.get(holder)
        if member is None:
            problems.append(f"shard {shard} is held by unknown member {holder!r}")
        elif not member.live and member.fenced_at_ms is None:
            problems.append(f"shard {shard} is held by member {holder!r} in state {member.state}")
        if shard not in assignable and (shard not in revocable or group.target.get(shard)):
            problems.append(
                f"shard {shard} is held by {holder!r} but is not assignable "
                f"(shardCount={group.shard_count})"
            )
    for shard, target in sorted(group.target.items()):
        if target not in live:
            problems.append(f"shard {shard} targets member {target!r} which is not live")
        if shard not in assignable:
            problems.append(f"shard {shard} is a target of {target!r} but is not assignable")
    if live:
        missing = sorted(assignable - set(group.target))
        if missing:
            problems.append(f"shards {missing} have no target although {len(live)} members live")
    return problems
