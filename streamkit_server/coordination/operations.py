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
from streamkit_server.coordination.executor import Operation, group_not_found
from streamkit_server.core import (
    CoordinatorConfig,
    GroupMetadata,
    Result,
    WitnessSeen,
    create_group,
    delete_group,
    handle_heartbeat,
    tick,
)
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
    seen: list[WitnessSeen],
    principal: str | None = None,
) -> Operation[HeartbeatResponse]:
    """``seen`` receives what the report claimed, when it claimed state Redis lacks."""

    def op(group: GroupMetadata | None, now: int) -> Result[HeartbeatResponse]:
        seen.clear()  # a CAS conflict runs the op again: keep the last run's verdict
        if group is None:
            metrics.metadata_missing.inc()
            raise group_not_found(keys)
        # The core refuses a join past the member limit (TOO_MANY_MEMBERS).
        result = handle_heartbeat(group, member_id, request, now, config, principal)
        if request.metadata_version > group.metadata_version:
            metrics.metadata_version_ahead.inc()
        if result.witness is not None:
            seen.append(result.witness)
        return result

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
        return create_group(group, keys.stream_prefix, keys.consumer_group, layout, now)

    return op


def delete_group_op(keys: GroupKeys, force: bool) -> Operation[GroupMetadata]:
    """Answers the group as it was before the deletion."""

    def op(group: GroupMetadata | None, now: int) -> Result[GroupMetadata]:
        return delete_group(group, keys.stream_prefix, keys.consumer_group, force)

    return op
