"""Wire models of authentication, group and stream administration, and producer routing."""

from __future__ import annotations

from pydantic import (
    AwareDatetime,
    Field,
    StrictBool,
)

from streamkit.protocol.wire import (
    GroupState,
    IdStr,
    Int32,
    Int64,
    MigrationState,
    NonNegInt32,
    PositiveInt32,
    TextStr,
    WireModel,
)

__all__ = [
    "CreateGroupRequest",
    "CreateStreamRequest",
    "DeleteGroupRequest",
    "GroupListResponse",
    "GroupResponse",
    "LoginRequest",
    "LoginResponse",
    "Migration",
    "ProducerRoutingResponse",
    "ProducerRoutingShard",
    "RollbackMigrationRequest",
    "ScaleGroupRequest",
    "ScaleStreamRequest",
    "StreamCreateResponse",
    "StreamScaleResponse",
]

# --------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------


class LoginRequest(WireModel):
    username: IdStr | None = None
    password: TextStr | None = None


class LoginResponse(WireModel):
    access_token: str | None = None
    token_type: str | None = None
    expires_at: AwareDatetime | None = None
    expires_in_seconds: Int64 | None = None
    roles: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------
# Groups, streams and resharding (admin)
# --------------------------------------------------------------------------


class _CreateRequest(WireModel):
    # createStreamGroup and createCoordinatorGroup take the same body; each
    # keeps its own class for its own schema name in the contract.
    initial_shard_count: PositiveInt32 | None = None
    requested_by: TextStr
    reason: TextStr | None = None


class CreateGroupRequest(_CreateRequest):
    pass


class CreateStreamRequest(_CreateRequest):
    pass


class StreamCreateResponse(WireModel):
    stream_prefix: str
    shard_count: PositiveInt32
    metadata_version: Int64


class _AuditedChange(WireModel):
    # Who asked and why, for the coordinator's audit log; both required.
    requested_by: TextStr
    reason: TextStr


class DeleteGroupRequest(_AuditedChange):
    force: StrictBool = False


class _ScaleRequest(WireModel):
    # Same body for a group's resharding and a stream's scale (as for creates).
    target_shard_count: NonNegInt32
    requested_by: TextStr
    reason: TextStr
    # A plain string in the contract (no date-time format), so it is passed
    # through untouched rather than guessed at.
    deprecated_after: IdStr | None = None


class ScaleGroupRequest(_ScaleRequest):
    pass


class ScaleStreamRequest(_ScaleRequest):
    pass


class RollbackMigrationRequest(_AuditedChange):
    pass


class Migration(WireModel):
    resharding_id: str | None = None
    from_shard_count: Int32 | None = None
    to_shard_count: Int32 | None = None
    state: MigrationState | None = None
    created_at: AwareDatetime | None = None
    updated_at: AwareDatetime | None = None


class StreamScaleResponse(WireModel):
    stream_prefix: str
    target_shard_count: Int32
    affected_consumer_groups: list[str]
    migrations: list[Migration]


class GroupResponse(WireModel):
    stream_prefix: str
    consumer_group: str
    state: GroupState
    group_epoch: Int64
    assignment_epoch: Int64
    metadata_version: Int64
    shard_count: Int32
    active_migration: Migration | None = None
    # memberId -> number of shards.
    target_assignment_summary: dict[str, Int32] = Field(default_factory=dict)
    current_assignment_summary: dict[str, Int32] = Field(default_factory=dict)


class GroupListResponse(WireModel):
    """Body of ``listCoordinatorGroups`` (an inline schema in the contract)."""

    groups: list[GroupResponse] = Field(default_factory=list)


# --------------------------------------------------------------------------
# Producer routing
# --------------------------------------------------------------------------


class ProducerRoutingShard(WireModel):
    shard_index: NonNegInt32 | None = None
    stream_key: str | None = None
    redis_slot: Int32 | None = None


class ProducerRoutingResponse(WireModel):
    stream_prefix: str | None = None
    consumer_group: str | None = None
    metadata_version: Int64 | None = None
    shard_count: Int32 | None = None
    stream_key_pattern: str | None = None
    shards: list[ProducerRoutingShard] = Field(default_factory=list)
