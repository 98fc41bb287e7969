"""Wire models of the coordinator HTTP API (``/coord/v1``).

This package is the single source of wire truth shared by the client package
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

from streamkit.protocol.admin import (
    CreateGroupRequest,
    CreateStreamRequest,
    DeleteGroupRequest,
    GroupListResponse,
    GroupResponse,
    LoginRequest,
    LoginResponse,
    Migration,
    ProducerRoutingResponse,
    ProducerRoutingShard,
    RollbackMigrationRequest,
    ScaleGroupRequest,
    ScaleStreamRequest,
    StreamCreateResponse,
    StreamScaleResponse,
)
from streamkit.protocol.members import (
    LEAVE_EPOCH as LEAVE_EPOCH,
)
from streamkit.protocol.members import (
    STATIC_LEAVE_EPOCH as STATIC_LEAVE_EPOCH,
)
from streamkit.protocol.members import (
    AssignmentView,
    HeartbeatAnswer,
    HeartbeatRequest,
    HeartbeatResponse,
    RevokingShardReport,
    RuntimeConsumerCapacity,
    ShardConsumptionProgress,
)
from streamkit.protocol.monitoring import (
    HEALTH_EXTENSIONS,
    AssignmentsResponse,
    ConsumerShardProgress,
    ConsumptionProgressResponse,
    ErrorResponse,
    GrafanaOptionRow,
    HealthResponse,
    MemberListResponse,
    MemberView,
    MigrationsResponse,
    MonitoringSessionResponse,
    StreamMessageRecord,
    StreamMessagesPageResponse,
    StreamShardOffset,
    StreamShardOffsetsResponse,
)
from streamkit.protocol.wire import (
    API_PREFIX,
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS,
    GrafanaRow,
    GroupState,
    HealthStatus,
    HeartbeatStatus,
    MemberState,
    MigrationState,
    RevokingShardState,
    ShardId,
    StreamMessagePageDirection,
    WireModel,
    shard_ids,
    shard_indexes,
)
from streamkit.protocol.wire import (
    IdStr as IdStr,
)
from streamkit.protocol.wire import (
    Int32 as Int32,
)
from streamkit.protocol.wire import (
    Int64 as Int64,
)
from streamkit.protocol.wire import (
    NonNegInt32 as NonNegInt32,
)
from streamkit.protocol.wire import (
    PositiveInt32 as PositiveInt32,
)
from streamkit.protocol.wire import (
    TextStr as TextStr,
)

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
