"""Wire models of the monitoring endpoints: members, assignments, progress, health, errors."""

from __future__ import annotations

from typing import Any, Final

from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    StrictBool,
)

from streamkit.protocol.admin import (
    Migration,
)
from streamkit.protocol.wire import (
    Int32,
    Int64,
    MemberState,
    ShardId,
    StreamMessagePageDirection,
    WireModel,
)

__all__ = [
    "HEALTH_EXTENSIONS",
    "AssignmentsResponse",
    "ConsumerShardProgress",
    "ConsumptionProgressResponse",
    "ErrorResponse",
    "GrafanaOptionRow",
    "HealthResponse",
    "MemberListResponse",
    "MemberView",
    "MigrationsResponse",
    "MonitoringSessionResponse",
    "StreamMessageRecord",
    "StreamMessagesPageResponse",
    "StreamShardOffset",
    "StreamShardOffsetsResponse",
]

# --------------------------------------------------------------------------
# Monitoring
# --------------------------------------------------------------------------


class MemberView(WireModel):
    """Monitoring view of one member (schema ``MemberMetadata`` in the contract).

    Named ``MemberView`` because the server has its own internal
    ``MemberMetadata`` aggregate; the schema title keeps the contract name.
    The contract allows additional properties here, so unknown keys are kept
    and passed through.
    """

    model_config = ConfigDict(title="MemberMetadata", extra="allow")

    member_id: str | None = None
    member_name: str | None = None
    state: MemberState | None = None
    member_epoch: Int64 | None = None
    current_assignment: list[ShardId] = Field(default_factory=list)
    revoking: list[ShardId] = Field(default_factory=list)


class MemberListResponse(WireModel):
    """Body of ``listGroupMembers`` (an inline schema in the contract)."""

    members: list[MemberView] = Field(default_factory=list)


class AssignmentsResponse(WireModel):
    # Keyed by memberId.
    target_assignment: dict[str, list[ShardId]] = Field(default_factory=dict)
    current_assignments: dict[str, list[ShardId]] = Field(default_factory=dict)
    revoke_progress: dict[str, list[ShardId]] = Field(default_factory=dict)
    invariant_violations: list[str] = Field(default_factory=list)


class MigrationsResponse(WireModel):
    migrations: list[Migration] = Field(default_factory=list)
    active_resharding_id: str | None = None


class ConsumerShardProgress(WireModel):
    stream_prefix: str | None = None
    consumer_group: str | None = None
    member_id: str | None = None
    member_name: str | None = None
    member_state: MemberState | None = None
    shard: ShardId | None = None
    stream_key: str | None = None
    last_delivered_id: str | None = None
    last_acked_id: str | None = None
    pending_count: Int64 | None = None
    updated_at: AwareDatetime | None = None


class ConsumptionProgressResponse(WireModel):
    progress: list[ConsumerShardProgress] = Field(default_factory=list)


class StreamShardOffset(WireModel):
    shard: ShardId | None = None
    stream_key: str | None = None
    redis_slot: Int32 | None = None
    redis_node_endpoint: str | None = None
    stream_length: Int64 | None = None
    first_record_id: str | None = None
    last_record_id: str | None = None
    group_last_delivered_id: str | None = None
    pending_count: Int64 | None = None
    # None means Redis could not prove the lag (entries-read unknown); never
    # treat it as zero.
    lag: Int64 | None = None
    memory_usage_bytes: Int64 | None = None
    owner_member_ids: list[str] = Field(default_factory=list)


class StreamShardOffsetsResponse(WireModel):
    stream_prefix: str | None = None
    consumer_group: str | None = None
    shards: list[StreamShardOffset] = Field(default_factory=list)
    total_stream_length: Int64 | None = None
    total_pending_count: Int64 | None = None
    total_lag: Int64 | None = None
    total_memory_usage_bytes: Int64 | None = None
    memory_usage_known: StrictBool | None = None


class StreamMessageRecord(WireModel):
    shard: ShardId | None = None
    stream_key: str | None = None
    record_id: str | None = None
    fields: dict[str, str] = Field(default_factory=dict)
    payload: str | None = None


class StreamMessagesPageResponse(WireModel):
    stream_prefix: str | None = None
    consumer_group: str | None = None
    shard: ShardId | None = None
    stream_key: str | None = None
    direction: StreamMessagePageDirection | None = None
    limit: Int32 | None = None
    records: list[StreamMessageRecord] = Field(default_factory=list)
    next_cursor: str | None = None


class MonitoringSessionResponse(WireModel):
    authenticated: StrictBool | None = None
    username: str | None = None


class HealthResponse(WireModel):
    # One of HealthStatus; a plain string in the contract.
    status: str | None = None
    coordinator_id: str | None = None
    redis: str | None = None
    loop: str | None = None
    # streamkit's own, beside the contract's four: why the status is not UP
    # (empty when it is), and the facts it was decided from.
    reasons: list[str] | None = None
    terminating: bool | None = None
    tick_lag_seconds: float | None = None
    tick_interval_seconds: float | None = None
    schema_version: int | None = None
    layout_version: int | None = None
    unreadable_groups: list[str] | None = None

    def to_wire(self, *, exclude_none: bool = False) -> dict[str, Any]:
        wire = super().to_wire(exclude_none=exclude_none)
        # Extensions are left out rather than sent as null: an answer without
        # them reads exactly like the reference's four fields.
        for name in HEALTH_EXTENSIONS:
            if name in wire and wire[name] is None:
                del wire[name]
        return wire


#: streamkit's fields of ``HealthResponse`` beside the contract's four.
HEALTH_EXTENSIONS: Final = frozenset(
    {"reasons", "terminating", "tickLagSeconds", "tickIntervalSeconds", "schemaVersion",
     "layoutVersion", "unreadableGroups"}
)  # fmt: skip


class ErrorResponse(WireModel):
    status: str | None = None
    error_code: str | None = None
    message: str | None = None


class GrafanaOptionRow(WireModel):
    """Grafana variable option; the double-underscore keys are Grafana's own."""

    text: str | None = Field(default=None, alias="__text")
    value: str | None = Field(default=None, alias="__value")
