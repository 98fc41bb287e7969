"""Request bodies with streamkit's extensions to the reference contract.

``ordering`` (optional, ``"none"`` or ``"key"``) is not in the reference: it
opts a stream into per-key ordered resharding (see docs/resharding.md).  A
stream stores its mode at creation; a scale request may override it for that
one scale.  Clients of the reference never send it and see no difference.

``targetShardCount`` is parsed as any int32 so that a negative value gets a
specific error code (``INVALID_TARGET_SHARD_COUNT``) instead of the generic
validation error; the served schema still says ``minimum: 0``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from streamkit import protocol as wire
from streamkit.protocol import Int32
from streamkit_server.streams import Ordering

# Named like the contract's schemas (and the models they extend), so the
# served OpenAPI document keeps the reference's component names.
__all__ = ["CreateGroupRequest", "CreateStreamRequest", "ScaleGroupRequest", "ScaleStreamRequest"]

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


class CreateStreamRequest(wire.CreateStreamRequest):
    ordering: Ordering | None = _ORDERING


class CreateGroupRequest(wire.CreateGroupRequest):
    ordering: Ordering | None = _ORDERING


class ScaleStreamRequest(wire.ScaleStreamRequest):
    target_shard_count: TargetShardCount
    ordering: Ordering | None = _ORDERING


class ScaleGroupRequest(wire.ScaleGroupRequest):
    target_shard_count: TargetShardCount
    ordering: Ordering | None = _ORDERING
