"""Admin mutations and group reads: streams, groups, producer routing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.types import DecoratedCallable

from streamkit.protocol import (
    API_PREFIX,
    GroupResponse,
    ProducerRoutingResponse,
    StreamCreateResponse,
)
from streamkit_server.api.audit import audited
from streamkit_server.api.bodies import (
    CreateGroupRequest,
    CreateStreamRequest,
    DeleteGroupRequest,
)
from streamkit_server.api.deps import AUTHORIZE, Caller, group_keys, runtime
from streamkit_server.api.errors import CALLER_ERRORS, documented
from streamkit_server.coordination import views
from streamkit_server.core.streams import StreamChoices
from streamkit_server.errors import Rejected
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.provisioning import validate_stream_prefix

router = APIRouter(prefix=API_PREFIX, dependencies=[AUTHORIZE])

Keys = Annotated[GroupKeys, Depends(group_keys)]

_GROUP = "/streams/{streamPrefix}/groups/{consumerGroup}"

_ERRORS = {
    400: "Invalid request.",
    **CALLER_ERRORS,
    503: "Coordinator terminating, busy, or metadata unusable.",
}


def _create(
    path: str, operation_id: str, model: type[Any], exists: str
) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """``POST`` creating a stream or a group: ``201`` with it, ``409`` when it ``exists``."""
    return router.post(
        path,
        operation_id=operation_id,
        tags=["Groups"],
        status_code=201,
        response_model=model,
        responses=documented({409: exists, **_ERRORS}),
    )


def _choices(body: CreateStreamRequest | CreateGroupRequest) -> StreamChoices:
    """streamkit's extensions of a create (no retention: the stream keeps, or gets, the default)."""
    retention = None if body.retention is None else body.retention.policy()
    return StreamChoices(body.ordering, retention)


@_create("/streams/{streamPrefix}", "createStreamGroup", StreamCreateResponse, "Stream exists.")
async def create_stream(
    request: Request, streamPrefix: str, body: CreateStreamRequest, principal: Caller
) -> JSONResponse:
    validate_stream_prefix(streamPrefix)
    async with audited(request):
        result = await runtime(request).service.create_stream(streamPrefix, body, _choices(body))
    return JSONResponse(result.to_wire(), status_code=201)


@_create(_GROUP, "createCoordinatorGroup", GroupResponse, "Group exists.")
async def create_group(
    request: Request, keys: Keys, body: CreateGroupRequest, principal: Caller
) -> JSONResponse:
    async with audited(request):
        result = await runtime(request).service.create_group(keys, body, _choices(body))
    return JSONResponse(result.to_wire(), status_code=201)


@router.get(
    _GROUP,
    operation_id="getCoordinatorGroup",
    tags=["Groups"],
    response_model=GroupResponse,
    responses=documented({404: "Group not found.", **_ERRORS}),
)
async def get_group(request: Request, keys: Keys, principal: Caller) -> JSONResponse:
    group = await runtime(request).service.read_group(keys)
    return JSONResponse(views.group_response(group).to_wire())


@router.delete(
    _GROUP,
    operation_id="deleteCoordinatorGroup",
    tags=["Groups"],
    response_model=GroupResponse,
    responses=documented({404: "Group not found.", 422: "Group still has members.", **_ERRORS}),
)
async def delete_group(
    request: Request, keys: Keys, body: DeleteGroupRequest, principal: Caller
) -> JSONResponse:
    async with audited(request):
        result = await runtime(request).service.delete_group(keys, body)
    return JSONResponse(result.to_wire())


@router.get(
    f"{_GROUP}/producer-routing",
    operation_id="getProducerRoutingMetadata",
    tags=["Producer Routing"],
    response_model=ProducerRoutingResponse,
    responses=documented({404: "Group not found.", **_ERRORS}),
)
async def producer_routing(request: Request, keys: Keys, principal: Caller) -> JSONResponse:
    service = runtime(request).service
    try:
        group = await service.read_group(keys)
    except Rejected as exc:
        if exc.error_code == "GROUP_NOT_FOUND":
            service.metrics.metadata_missing.inc()
        raise
    return JSONResponse(views.producer_routing(group).to_wire())
