"""Resharding endpoints: scale a stream, read and roll back migrations.

A scale always changes the whole stream (its shard streams are shared by
every group): ``startGroupResharding`` is the reference's compatibility path
and does exactly what ``scaleStreamShards`` does, answering with the one
group's migration.  A rollback likewise applies to every group of the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.types import DecoratedCallable

from streamkit.protocol import (
    API_PREFIX,
    Migration,
    StreamScaleResponse,
)
from streamkit_server.api.audit import audited
from streamkit_server.api.bodies import (
    RollbackMigrationRequest,
    ScaleGroupRequest,
    ScaleStreamRequest,
)
from streamkit_server.api.deps import AUTHORIZE, Caller, group_keys, runtime
from streamkit_server.api.errors import CALLER_ERRORS, documented
from streamkit_server.coordination import views
from streamkit_server.coordination.resharding import ScaleOutcome, find_migration
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.provisioning import validate_stream_prefix

router = APIRouter(prefix=API_PREFIX, tags=["Resharding"], dependencies=[AUTHORIZE])

Keys = Annotated[GroupKeys, Depends(group_keys)]
ReshardingId = Annotated[str, Path(min_length=1, max_length=128)]

_GROUP = "/streams/{streamPrefix}/groups/{consumerGroup}"
_MIGRATION = f"{_GROUP}/migrations/{{reshardingId}}"


def _errors(extra: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    texts = {
        400: "Invalid request or targetShardCount (INVALID_TARGET_SHARD_COUNT).",
        **CALLER_ERRORS,
        503: "Provisioning failed (REDIS_STREAM_PROVISIONING_FAILED), coordinator busy, "
        "terminating, or metadata unusable.",
        **extra,
    }
    return documented(texts)


async def _scale(
    request: Request,
    stream_prefix: str,
    body: ScaleStreamRequest | ScaleGroupRequest,
    *,
    group: str | None = None,
) -> ScaleOutcome:
    """What both scale endpoints do: the whole stream reshards."""
    async with audited(request):
        return await runtime(request).resharding.scale(
            stream_prefix,
            body.target_shard_count,
            requested_by=body.requested_by,
            reason=body.reason,
            ordering=body.ordering,
            group=group,
        )


def _scale_route(
    path: str, operation_id: str, model: type[Any], not_found: str, conflict: str
) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """``POST`` of a scale: ``202`` with the change started, ``422`` when nothing changes."""
    return router.post(
        path,
        operation_id=operation_id,
        status_code=202,
        response_model=model,
        responses=_errors(
            {
                404: not_found,
                409: conflict,
                422: "Shard count unchanged (SHARD_COUNT_UNCHANGED).",
            }
        ),
    )


@_scale_route(
    "/streams/{streamPrefix}/scale",
    "scaleStreamShards",
    StreamScaleResponse,
    not_found="Stream not found (STREAM_NOT_FOUND).",
    conflict="Active migration (ACTIVE_MIGRATION_EXISTS), no groups, or foreign shard keys.",
)
async def scale_stream(
    request: Request, streamPrefix: str, body: ScaleStreamRequest, principal: Caller
) -> JSONResponse:
    validate_stream_prefix(streamPrefix)
    outcome = await _scale(request, streamPrefix, body)
    return JSONResponse(
        views.stream_scale(
            streamPrefix, outcome.target_shard_count, outcome.groups, outcome.resharding_id
        ),
        status_code=202,
    )


@_scale_route(
    f"{_GROUP}/scale",
    "startGroupResharding",
    Migration,
    not_found="Group not found (GROUP_NOT_FOUND).",
    conflict="Active migration (ACTIVE_MIGRATION_EXISTS) or foreign shard keys.",
)
async def scale_group(
    request: Request, keys: Keys, body: ScaleGroupRequest, principal: Caller
) -> JSONResponse:
    """Compatibility path: scales the whole stream, answers with this group's migration."""
    outcome = await _scale(request, keys.stream_prefix, body, group=keys.consumer_group)
    group = outcome.groups[keys.consumer_group]
    record = find_migration(group, outcome.resharding_id)
    return JSONResponse(views.migration(record), status_code=202)


@router.get(
    _MIGRATION,
    operation_id="getReshardingMigration",
    response_model=Migration,
    responses=_errors({404: "Group or migration not found (MIGRATION_NOT_FOUND)."}),
)
async def get_migration(
    request: Request, keys: Keys, reshardingId: ReshardingId, principal: Caller
) -> JSONResponse:
    group = await runtime(request).service.read_group(keys)
    return JSONResponse(views.migration(find_migration(group, reshardingId)))


@router.post(
    f"{_MIGRATION}/rollback",
    operation_id="rollbackReshardingMigration",
    status_code=202,
    response_model=Migration,
    responses=_errors(
        {
            404: "Group or migration not found (MIGRATION_NOT_FOUND).",
            422: "Rollback no longer allowed (ROLLBACK_NOT_ALLOWED): a shard was retired, or "
            "the migration has ended.",
        }
    ),
)
async def rollback(
    request: Request,
    keys: Keys,
    reshardingId: ReshardingId,
    body: RollbackMigrationRequest,
    principal: Caller,
) -> JSONResponse:
    async with audited(request):
        group = await runtime(request).resharding.rollback(keys, reshardingId)
    return JSONResponse(views.migration(find_migration(group, reshardingId)), status_code=202)
