"""Wire models of the coordinator HTTP API (``/coord/v1``).

This module is the single source of wire truth shared by the client package
``streamkit`` and the server package ``streamkit_server``: both import their
request and response bodies from here and nowhere else, so a field can never
be renamed on one side only.

The models mirror ``components.schemas`` of the reference contract
(``coordinator.v1.yaml``, the OpenAPI document of the JVM coordinator we are
wire-compatible with) one to one:

* JSON keys are camelCase, Python attributes snake_case.  Every model accepts
  both spellings on input and :meth:`WireModel.to_wire` dumps the camelCase
  JSON form.
* ``required`` lists, ``minimum`` constraints, ``nullable`` and enum values are
  taken verbatim from the contract; ``tests/test_protocol.py`` checks the field
  names, required lists and enum values against the yaml.
* Integers are strict: JSON booleans, numeric strings and floats are rejected
  instead of being coerced, because a heartbeat carrying ``memberEpoch: true``
  is a client bug that must not silently become epoch 1.  They are also bounded
  to the JVM ``int``/``long`` ranges the reference uses.
* Strings in request bodies have bounded lengths so oversized values fail
  validation before they reach audit logs or Redis.
* Unknown fields are ignored, because newer reference clients and servers may
  send fields this version does not know.

Optional fields of the contract default to ``None`` (or an empty list/dict);
the fields the contract marks ``nullable`` are the ones whose ``null`` carries
meaning (for example ``lag: null`` means "not proven drained").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Self

from annotated_types import Ge, Le
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    Strict,
    StrictBool,
    StringConstraints,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = [
    "API_PREFIX",
    "HEALTH_EXTENSIONS",
    "PROTOCOL_VERSION",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "AssignmentView",
    "AssignmentsResponse",
    "ConsumerShardProgress",
    "ConsumptionProgressResponse",
    "CreateGroupRequest",
    "CreateStreamRequest",
    "DeleteGroupRequest",
    "ErrorResponse",
    "GrafanaOptionRow",
    "GrafanaRow",
    "GroupListResponse",
    "GroupResponse",
    "GroupState",
    "HealthResponse",
    "HealthStatus",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "HeartbeatStatus",
    "LoginRequest",
    "LoginResponse",
    "MemberListResponse",
    "MemberState",
    "MemberView",
    "Migration",
    "MigrationState",
    "MigrationsResponse",
    "MonitoringSessionResponse",
    "ProducerRoutingResponse",
    "ProducerRoutingShard",
    "RevokingShardReport",
    "RevokingShardState",
    "RollbackMigrationRequest",
    "RuntimeConsumerCapacity",
    "ScaleGroupRequest",
    "ScaleStreamRequest",
    "ShardConsumptionProgress",
    "ShardId",
    "StreamCreateResponse",
    "StreamMessagePageDirection",
    "StreamMessageRecord",
    "StreamMessagesPageResponse",
    "StreamScaleResponse",
    "StreamShardOffset",
    "StreamShardOffsetsResponse",
    "WireModel",
    "shard_ids",
    "shard_indexes",
]

PROTOCOL_VERSION: Final = 1
"""Heartbeat protocol version this code speaks (``HeartbeatRequest.protocolVersion``)."""

SUPPORTED_PROTOCOL_VERSIONS: Final = range(1, 2)
"""Versions the coordinator accepts; anything else is answered ``UNSUPPORTED_PROTOCOL``."""

API_PREFIX: Final = "/coord/v1"
"""Path prefix of every coordinator endpoint."""


# --------------------------------------------------------------------------
# Scalar building blocks
# --------------------------------------------------------------------------

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True)
class _WireIntSchema:
    """JSON-schema tweak for the bounded wire integers.

    The range bounds exist to reject values the JVM side cannot represent
    (``int``/``long``).  They are not part of the contract, so they are left
    out of the generated schema, which instead says ``format: int64`` where the
    reference does.  Narrower bounds declared by a field (``minimum: 0`` and so
    on) are kept.
    """

    lo: int
    hi: int
    fmt: str | None

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        if schema.get("minimum") == self.lo:
            del schema["minimum"]
        if schema.get("maximum") == self.hi:
            del schema["maximum"]
        if self.fmt is not None:
            schema["format"] = self.fmt
        return schema


# ``type: integer`` without a format is a JVM ``int`` in the reference.
Int32 = Annotated[
    int, Strict(), Ge(_INT32_MIN), Le(_INT32_MAX), _WireIntSchema(_INT32_MIN, _INT32_MAX, None)
]
# ``type: integer, format: int64`` is a JVM ``long``.
Int64 = Annotated[
    int, Strict(), Ge(_INT64_MIN), Le(_INT64_MAX), _WireIntSchema(_INT64_MIN, _INT64_MAX, "int64")
]
NonNegInt32 = Annotated[Int32, Ge(0)]
PositiveInt32 = Annotated[Int32, Ge(1)]

# Identifiers chosen by clients (member ids, request ids, names, redis ids).
IdStr = Annotated[str, StringConstraints(max_length=256)]
# Free text chosen by operators (requestedBy, reason) and stream keys.
TextStr = Annotated[str, StringConstraints(max_length=1024)]

GrafanaRow = dict[str, Any]
"""Grafana*Row schemas (group/member/shard/assignment/message) are free-form objects."""


# --------------------------------------------------------------------------
# Enums
# --------------------------------------------------------------------------


class GroupState(StrEnum):
    EMPTY = "EMPTY"
    ASSIGNING = "ASSIGNING"
    RECONCILING = "RECONCILING"
    STABLE = "STABLE"


class MemberState(StrEnum):
    STARTING = "STARTING"
    ACTIVE = "ACTIVE"
    LEAVING = "LEAVING"
    EXPIRED = "EXPIRED"
    FENCED = "FENCED"


class MigrationState(StrEnum):
    PREPARING = "PREPARING"
    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"
    DEPRECATED = "DEPRECATED"
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"


class HeartbeatStatus(StrEnum):
    OK = "OK"
    RETRY = "RETRY"
    SYNC_METADATA = "SYNC_METADATA"
    REVOKE_PENDING = "REVOKE_PENDING"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
    UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"
    INVALID_REQUEST = "INVALID_REQUEST"


class RevokingShardState(StrEnum):
    REVOKING = "REVOKING"
    DRAINING = "DRAINING"
    REVOKED = "REVOKED"


class StreamMessagePageDirection(StrEnum):
    FORWARD = "FORWARD"
    BACKWARD = "BACKWARD"


class HealthStatus(StrEnum):
    """Values of ``HealthResponse.status``.

    Not an enum in the contract (the field is a plain string there, so the model
    keeps ``str``), but the spec fixes these three values and both packages need
    to spell them the same way.
    """

    UP = "UP"
    DEGRADED = "DEGRADED"
    DOWN = "DOWN"


# --------------------------------------------------------------------------
# Base model
# --------------------------------------------------------------------------


class WireModel(BaseModel):
    """Base of every wire model: camelCase JSON, snake_case Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        # Server code builds responses with Python names; parsers get camelCase.
        populate_by_name=True,
        # Peers may be newer than us; unknown keys are not an error.
        extra="ignore",
    )

    def to_wire(self, *, exclude_none: bool = False) -> dict[str, Any]:
        """JSON-ready dict with camelCase keys (enums as values, datetimes ISO-8601).

        ``None`` values are kept by default so ``nullable`` fields are sent as an
        explicit ``null`` like the reference does.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_none=exclude_none)

    @classmethod
    def from_wire(cls, data: str | bytes | bytearray | Mapping[str, Any]) -> Self:
        """Parse a raw JSON document or an already decoded JSON object."""
        if isinstance(data, str | bytes | bytearray):
            return cls.model_validate_json(data)
        return cls.model_validate(data)


def _reject_duplicate_shards(shards: list[ShardId], field: str) -> list[ShardId]:
    # The contract declares these arrays ``uniqueItems``; a duplicate means the
    # sender's ownership bookkeeping is broken, so fail loudly instead of
    # silently collapsing it.
    seen: set[ShardId] = set()
    duplicates: set[int] = set()
    for shard in shards:
        if shard in seen:
            duplicates.add(shard.shard_index)
        seen.add(shard)
    if duplicates:
        raise ValueError(
            f"{field} must not contain duplicate shards "
            f"(duplicate shardIndex: {sorted(duplicates)})"
        )
    return shards


_UNIQUE_ITEMS: Final[dict[str, Any]] = {"uniqueItems": True}


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------


class ShardId(WireModel):
    """One physical shard of a stream prefix (stream key ``{streamPrefix}:{shardIndex}``).

    Frozen so it is hashable: ownership is naturally a set of shards.

    ``shardIndex`` is required here although the contract's ``ShardId`` schema
    has no ``required`` list: a shard reference without an index cannot be
    acted upon, the reference implementations always send it, and an optional
    index would push ``None`` checks into every ownership computation.
    """

    model_config = ConfigDict(frozen=True)

    shard_index: NonNegInt32


def shard_ids(indexes: Iterable[int]) -> list[ShardId]:
    """``ShardId`` list for the given indexes, sorted and without duplicates.

    Sorted so that the same ownership always serialises to the same heartbeat
    body, which keeps heartbeats byte-for-byte idempotent.
    """
    return [ShardId(shard_index=index) for index in sorted(set(indexes))]


def shard_indexes(shards: Iterable[ShardId]) -> list[int]:
    """Sorted, de-duplicated shard indexes of ``shards``."""
    return sorted({shard.shard_index for shard in shards})


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


class CreateGroupRequest(WireModel):
    initial_shard_count: PositiveInt32 | None = None
    requested_by: TextStr
    reason: TextStr | None = None


class CreateStreamRequest(WireModel):
    initial_shard_count: PositiveInt32 | None = None
    requested_by: TextStr
    reason: TextStr | None = None


class StreamCreateResponse(WireModel):
    stream_prefix: str
    shard_count: PositiveInt32
    metadata_version: Int64


class DeleteGroupRequest(WireModel):
    requested_by: TextStr
    reason: TextStr
    force: StrictBool = False


class ScaleGroupRequest(WireModel):
    target_shard_count: NonNegInt32
    requested_by: TextStr
    reason: TextStr
    # A plain string in the contract (no date-time format), so it is passed
    # through untouched rather than guessed at.
    deprecated_after: IdStr | None = None


class ScaleStreamRequest(WireModel):
    target_shard_count: NonNegInt32
    requested_by: TextStr
    reason: TextStr
    deprecated_after: IdStr | None = None


class RollbackMigrationRequest(WireModel):
    requested_by: TextStr
    reason: TextStr


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
