"""Request bodies with streamkit's extensions to the reference contract.

``ordering`` (optional, ``"none"`` or ``"key"``) is not in the reference: it
opts a stream into per-key ordered resharding (see docs/resharding.md).  A
stream stores its mode at creation; a scale request may override it for that
one scale.  Clients of the reference never send it and see no difference.

``retention`` (optional, ``{"maxAgeMs": .., "maxLength": ..}``) is not in the
reference either: the stream's retention that respects the groups (see
docs/operations.md#retention); given with a group create it replaces the
stream's.  ``setStreamRetention`` changes it later.

``targetShardCount`` is parsed as any int32 so that a negative value gets a
specific error code (``INVALID_TARGET_SHARD_COUNT``) instead of the generic
validation error; the served schema still says ``minimum: 0``.

Bounds the reference leaves open are closed here (400 beyond them):
``initialShardCount`` is at most ``MAX_SHARD_COUNT``, the same bound as a
scale, and ``requestedBy`` (and ``reason`` where the reference requires it)
must not be blank: an audit record naming nobody is worthless.  The shard
lists of a heartbeat hold at most ``MAX_SHARD_COUNT`` entries.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from streamkit import protocol as wire
from streamkit.protocol import (
    Int32,
    Int64,
    RevokingShardReport,
    ShardConsumptionProgress,
    ShardId,
    TextStr,
    WireModel,
)
from streamkit_server.core import MAX_SHARD_COUNT
from streamkit_server.core.retention import (
    MAX_RETENTION_AGE_MS,
    MAX_RETENTION_LENGTH,
    RetentionPolicy,
)
from streamkit_server.core.streams import Ordering
from streamkit_server.store.provisioning import unsafe_char

# Named like the contract's schemas (and the models they extend), so the
# served OpenAPI document keeps the reference's component names.
__all__ = [
    "CreateGroupRequest",
    "CreateStreamRequest",
    "DeleteGroupRequest",
    "HeartbeatRequest",
    "ReplayDeadLetterRequest",
    "RollbackMigrationRequest",
    "ScaleGroupRequest",
    "ScaleStreamRequest",
    "SetRetentionRequest",
    "StreamRetention",
]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or blank")
    return value


RequiredText = Annotated[
    TextStr, AfterValidator(_not_blank), Field(json_schema_extra={"minLength": 1})
]
InitialShardCount = Annotated[
    Int32,
    Field(ge=1, le=MAX_SHARD_COUNT, description=f"Shard count, 1..{MAX_SHARD_COUNT}."),
]

_ORDERING = Field(
    default=None,
    description="streamkit extension: 'key' keeps per-partition-key order across scales "
    "(new shards are read only after the old ones are drained); default 'none'.",
)
_TARGET = Field(
    json_schema_extra={"minimum": 0},
    description="Target physical shard count; 0 drains and removes every shard.",
)
TargetShardCount = Annotated[Int32, _TARGET]


MaxAgeMs = Annotated[
    Int64,
    Field(ge=1, le=MAX_RETENTION_AGE_MS, description="Trim entries older than this (ms)."),
]
MaxLength = Annotated[
    Int64,
    Field(
        ge=1,
        le=MAX_RETENTION_LENGTH,
        description="Keep at most about this many entries per shard.",
    ),
]


class StreamRetention(WireModel):
    """streamkit extension: retention that never trims what a consumer group still needs.

    Both null (or absent): no retention for this stream, even when the
    coordinator has a default.
    """

    max_age_ms: MaxAgeMs | None = None
    max_length: MaxLength | None = None

    def policy(self) -> RetentionPolicy:
        return RetentionPolicy(self.max_age_ms, self.max_length)


_RETENTION = Field(
    default=None,
    description="streamkit extension: the stream's retention (by age and/or length), "
    "which never trims entries a consumer group has not read or acknowledged; "
    "default: the coordinator's default retention, if any.",
)


class CreateStreamRequest(wire.CreateStreamRequest):
    initial_shard_count: InitialShardCount | None = None
    requested_by: RequiredText
    ordering: Ordering | None = _ORDERING
    retention: StreamRetention | None = _RETENTION


class CreateGroupRequest(wire.CreateGroupRequest):
    initial_shard_count: InitialShardCount | None = None
    requested_by: RequiredText
    ordering: Ordering | None = _ORDERING
    retention: StreamRetention | None = _RETENTION


class SetRetentionRequest(StreamRetention):
    """streamkit extension: set a stream's retention (both null: none, over the default)."""

    requested_by: RequiredText
    reason: TextStr | None = None


class DeleteGroupRequest(wire.DeleteGroupRequest):
    requested_by: RequiredText
    reason: RequiredText


class ScaleStreamRequest(wire.ScaleStreamRequest):
    target_shard_count: TargetShardCount
    requested_by: RequiredText
    reason: RequiredText
    ordering: Ordering | None = _ORDERING


class ScaleGroupRequest(wire.ScaleGroupRequest):
    target_shard_count: TargetShardCount
    requested_by: RequiredText
    reason: RequiredText
    ordering: Ordering | None = _ORDERING


class HeartbeatRequest(wire.HeartbeatRequest):
    # A member reports each shard of the stream at most once per list.
    owned_shards: list[ShardId] = Field(
        default_factory=list, json_schema_extra={"uniqueItems": True}, max_length=MAX_SHARD_COUNT
    )
    revoking_shards: list[RevokingShardReport] = Field(
        default_factory=list, max_length=MAX_SHARD_COUNT
    )
    shard_progress: list[ShardConsumptionProgress] = Field(
        default_factory=list, max_length=MAX_SHARD_COUNT
    )

    @field_validator("request_id", "member_id", "member_name", "incarnation")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # They reach logs, the audit trail, the console and the CLI.
        if value is not None and (bad := unsafe_char(value)) is not None:
            raise ValueError(f"must not contain control or format characters (found {bad!r})")
        return value


class RollbackMigrationRequest(wire.RollbackMigrationRequest):
    requested_by: RequiredText
    reason: RequiredText


FieldName = Annotated[str, Field(min_length=1, max_length=256)]


class ReplayDeadLetterRequest(WireModel):
    """streamkit extension: replay one dead letter (see ``coordination/dead_letters.py``)."""

    requested_by: RequiredText
    reason: TextStr | None = None
    key_field: FieldName | None = Field(
        default=None,
        description="Entry field holding the partition key: route the entry by it "
        "with the current layout.",
    )
    payload_key: FieldName | None = Field(
        default=None,
        description="Top-level key of the JSON 'payload' field holding the partition key.",
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> ReplayDeadLetterRequest:
        if self.key_field is not None and self.payload_key is not None:
            raise ValueError("give keyField or payloadKey, not both")
        return self
