"""The group operations the executor runs: each a core rule applied to a loaded group.

An ``Operation`` takes the current state (``None``: no such group) and the
time, and returns a core ``Result``; ``GroupExecutor.submit`` runs it under the
group's lock and writes its changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamkit.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
)
from streamkit_server.coordination.executor import Operation, group_already_exists, group_not_found
from streamkit_server.core import (
    CoordinatorConfig,
    GroupCreated,
    GroupDeleted,
    GroupMetadata,
    Result,
    handle_heartbeat,
    join_refusal,
    new_group,
    tick,
)
from streamkit_server.errors import CoordinatorError, Rejected
from streamkit_server.observability.metrics import Metrics
from streamkit_server.store.keys import GroupKeys

__all__ = ["create_group_op", "delete_group_op", "heartbeat_op", "tick_op"]


# -- operations ----------------------------------------------------------------------
# Each builds an ``Operation`` from its (immutable) inputs; the executor runs it
# and hands back its response.  Nothing is read back from them after submit.


def heartbeat_op(
    keys: GroupKeys,
    member_id: str,
    request: HeartbeatRequest,
    config: CoordinatorConfig,
    metrics: Metrics,
) -> Operation[HeartbeatResponse]:
    def op(group: GroupMetadata | None, now: int) -> Result[HeartbeatResponse]:
        if group is None:
            metrics.metadata_missing.inc()
            raise group_not_found(keys)
        refusal = join_refusal(group, member_id, request, config)
        if refusal is not None:
            raise Rejected("TOO_MANY_MEMBERS", refusal)
        if request.metadata_version > group.metadata_version:
            metrics.metadata_version_ahead.inc()
        return handle_heartbeat(group, member_id, request, now, config)

    return op


def tick_op(config: CoordinatorConfig) -> Operation[bool]:
    """Answers whether anything was due."""

    def op(group: GroupMetadata | None, now: int) -> Result[bool]:
        if group is None:
            return Result(None, (), False)
        return tick(group, now, config)

    return op


def create_group_op(keys: GroupKeys, layout: Sequence[int]) -> Operation[GroupMetadata]:
    def op(group: GroupMetadata | None, now: int) -> Result[GroupMetadata]:
        if group is not None:
            raise group_already_exists(keys)
        fresh = new_group(keys.stream_prefix, keys.consumer_group, len(layout), now)
        # The stream's current layout, which after an ordered reshard is not
        # the identity new_group assumes.
        created = fresh.model_copy(update={"layout": list(layout)})
        return Result(created, (GroupCreated(),), created)

    return op


def delete_group_op(keys: GroupKeys, force: bool) -> Operation[GroupMetadata]:
    """Answers the group as it was before the deletion."""

    def op(group: GroupMetadata | None, now: int) -> Result[GroupMetadata]:
        if group is None:
            raise group_not_found(keys)
        if group.active_migration() is not None:
            # Its Redis consumer groups take part in the drain proof of the
            # migration's removed shards; deleting mid-way would strand it.
            raise CoordinatorError(
                "ACTIVE_MIGRATION_EXISTS",
                "the group has an active resharding migration; wait for it to finish "
                "or roll it back, then delete",
            )
        live = group.live_member_ids()
        if (live or group.owners) and not force:
            raise CoordinatorError(
                "GROUP_NOT_INACTIVE",
                f"group has {len(live)} live members and {len(group.owners)} held shards; "
                "let the members leave first, or pass force=true for recovery",
            )
        return Result(None, (GroupDeleted(),), group)

    return op
