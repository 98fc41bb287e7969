"""Wire models of the member heartbeat (``HeartbeatRequest`` / ``HeartbeatResponse``)."""

from __future__ import annotations

from typing import Any, Final

from pydantic import (
    AwareDatetime,
    Field,
    field_validator,
)

from streamkit.protocol.wire import (
    _UNIQUE_ITEMS,
    HeartbeatStatus,
    IdStr,
    Int64,
    NonNegInt32,
    PositiveInt32,
    RevokingShardState,
    ShardId,
    TextStr,
    WireModel,
    _reject_duplicate_shards,
)

__all__ = [
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "AssignmentView",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "RevokingShardReport",
    "RuntimeConsumerCapacity",
    "ShardConsumptionProgress",
]

# --------------------------------------------------------------------------
# Member heartbeat
# --------------------------------------------------------------------------


class RuntimeConsumerCapacity(WireModel):
    runtime_max_concurrency: PositiveInt32 | None = None
    available_concurrency: NonNegInt32 | None = None


class RevokingShardReport(WireModel):
    shard: ShardId | None = None
    state: RevokingShardState | None = None
    in_flight: NonNegInt32 | None = None
    acked_at: AwareDatetime | None = None


class ShardConsumptionProgress(WireModel):
    shard: ShardId | None = None
    stream_key: TextStr | None = None
    last_delivered_id: IdStr | None = None
    last_acked_id: IdStr | None = None
    pending_count: Int64 | None = None
    updated_at: AwareDatetime | None = None


#: memberEpoch of a graceful leave.
LEAVE_EPOCH: Final = -1
#: memberEpoch of a static member's graceful leave before a restart (KIP-848's
#: -2): its assignment stays reserved for the member id until its lease ends.
#: Only accepted together with an ``incarnation``.
STATIC_LEAVE_EPOCH: Final = -2


class HeartbeatRequest(WireModel):
    # protocolVersion is only bounded below: a well-formed but unknown version
    # must reach the decision logic so it can answer UNSUPPORTED_PROTOCOL.
    protocol_version: PositiveInt32
    request_id: IdStr
    member_id: IdStr
    member_name: IdStr | None = None
    # 0 = join, -1 = leave, >0 = current epoch; not range-checked here because
    # an unexpected epoch is a fencing decision, not a malformed request.
    member_epoch: Int64
    metadata_version: Int64
    runtime_consumer_capacity: RuntimeConsumerCapacity
    owned_shards: list[ShardId] = Field(default_factory=list, json_schema_extra=_UNIQUE_ITEMS)
    revoking_shards: list[RevokingShardReport] = Field(default_factory=list)
    shard_progress: list[ShardConsumptionProgress] = Field(default_factory=list)
    # streamkit extension (the reference clients do not send it and the
    # reference server ignores it): a token that one start of one process
    # draws at random.  The coordinator stores it with the member so a second
    # process using the same member id, or a leave from an earlier start, can
    # be told apart from the member itself.
    incarnation: IdStr | None = Field(
        default=None,
        description="streamkit extension: a random token of one start of the member's "
        "process; a join, heartbeat or leave under another token does not act as the member.",
    )

    @field_validator("owned_shards")
    @classmethod
    def _unique_owned_shards(cls, value: list[ShardId]) -> list[ShardId]:
        return _reject_duplicate_shards(value, "ownedShards")

    def to_wire(self, *, exclude_none: bool = False) -> dict[str, Any]:
        wire = super().to_wire(exclude_none=exclude_none)
        # An extension is left out rather than sent as null: the body then
        # reads exactly like a reference client's.
        if wire.get("incarnation", "") is None:
            del wire["incarnation"]
        return wire


class AssignmentView(WireModel):
    assigned_shards: list[ShardId] = Field(default_factory=list, json_schema_extra=_UNIQUE_ITEMS)
    pending_shards: list[ShardId] = Field(default_factory=list, json_schema_extra=_UNIQUE_ITEMS)
    metadata_version: Int64 | None = None

    @field_validator("assigned_shards", "pending_shards")
    @classmethod
    def _unique_shards(cls, value: list[ShardId]) -> list[ShardId]:
        # Same rule as ownedShards: a response listing a shard twice is a
        # coordinator bug and must not be acted upon.
        return _reject_duplicate_shards(value, "assignment shards")


class HeartbeatResponse(WireModel):
    response_to: str | None = None
    status: HeartbeatStatus | None = None
    member_id: str | None = None
    member_epoch: Int64 | None = None
    heartbeat_interval_ms: Int64 | None = None
    rebalance_timeout_ms: Int64 | None = None
    group_epoch: Int64 | None = None
    assignment_epoch: Int64 | None = None
    metadata_version: Int64 | None = None
    assignment: AssignmentView | None = None


class HeartbeatAnswer(HeartbeatResponse):
    """``HeartbeatResponse`` plus streamkit's extension ``memberLeaseTtlMs``.

    The coordinator's member lease TTL, so a member can refuse a local
    assignment lease that would outlive it (it would read after its shards
    were handed away).  Reference clients ignore the unknown field; answers
    from a reference server simply lack it.
    """

    member_lease_ttl_ms: Int64 | None = None
