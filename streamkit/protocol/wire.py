"""Scalars, enums and the base of every wire model (``WireModel``, ``ShardId``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Self

from annotated_types import Ge, Le
from pydantic import (
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    Strict,
    StringConstraints,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = [
    "API_PREFIX",
    "PROTOCOL_VERSION",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "GrafanaRow",
    "GroupState",
    "HealthStatus",
    "HeartbeatStatus",
    "IdStr",
    "Int32",
    "Int64",
    "MemberState",
    "MigrationState",
    "NonNegInt32",
    "PositiveInt32",
    "RevokingShardState",
    "ShardId",
    "StreamMessagePageDirection",
    "TextStr",
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
    return [_shard_id(index) for index in sorted(set(indexes))]


#: Shard indexes below this have one shared ``ShardId`` each (``_shard_id``).
_SHARED_SHARD_IDS: Final = 4096
_shared: dict[int, ShardId] = {}


def _shard_id(index: int) -> ShardId:
    # Every heartbeat answer lists its member's shards: a frozen ``ShardId``
    # per index, validated once, instead of a new model per shard per answer.
    if type(index) is not int:  # a bool is refused as ShardId refuses it, not looked up
        return ShardId(shard_index=index)
    shard = _shared.get(index)
    if shard is None:
        shard = ShardId(shard_index=index)
        if 0 <= index < _SHARED_SHARD_IDS:
            _shared[index] = shard
    return shard


def shard_indexes(shards: Iterable[ShardId]) -> list[int]:
    """Sorted, de-duplicated shard indexes of ``shards``."""
    return sorted({shard.shard_index for shard in shards})
