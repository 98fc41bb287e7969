"""Admin mutations and group reads: streams, groups, producer routing."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from streamkit.protocol import (
    API_PREFIX,
    ErrorResponse,
    GroupResponse,
    ProducerRoutingResponse,
    StreamCreateResponse,
)
from streamkit_server import views
from streamkit_server.api.bodies import (
    CreateGroupRequest,
    CreateStreamRequest,
    DeleteGroupRequest,
)
from streamkit_server.api.deps import group_keys, require, runtime
from streamkit_server.api.errors import status_for
from streamkit_server.errors import Rejected
from streamkit_server.provisioning import validate_stream_prefix
from streamkit_server.security import Principal, Role
from streamkit_server.store import GroupKeys

router = APIRouter(prefix=API_PREFIX)
audit_log = logging.getLogger("streamkit_server.audit")

Reader = Annotated[Principal, Depends(require(Role.READ))]
Writer = Annotated[Principal, Depends(require(Role.WRITE))]
Keys = Annotated[GroupKeys, Depends(group_keys)]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Invalid request.",
        401: "Authentication required.",
        403: "Role missing.",
        503: "Coordinator terminating, busy, or metadata unusable.",
    }.items()
}


@asynccontextmanager
async def audited(
    request: Request,
    principal: Principal,
    action: str,
    body: BaseModel,
    stream_prefix: str,
    consumer_group: str | None,
    reason: str | None,
    success_status: int = 200,
) -> AsyncIterator[None]:
    """One audit record per admin mutation, whatever its outcome (SPEC §6)."""
    started = time.perf_counter()
    fingerprint = hashlib.sha256(body.model_dump_json(by_alias=True).encode()).hexdigest()[:16]
    status = success_status
    try:
        yield
    except Exception as exc:
        status = status_for(exc)
        raise
    finally:
        audit_log.info(
            "action=%s outcome=%s status=%d principal=%s roles=%s requestId=%s body=%s "
            "client=%s durationMs=%.1f streamPrefix=%s consumerGroup=%s reason=%r",
            action,
            "success" if status < 400 else "failure",
            status,
            principal.username,
            ",".join(sorted(principal.roles)),
            request.headers.get("x-request-id", "-"),
            fingerprint,
            request.client.host if request.client else "-",
            (time.perf_counter() - started) * 1000,
            stream_prefix,
            consumer_group or "-",
            reason,
        )


@router.post(
    "/streams/{streamPrefix}",
    operation_id="createStreamGroup",
    tags=["Groups"],
    status_code=201,
    response_model=StreamCreateResponse,
    responses={409: {"model": ErrorResponse, "description": "Stream exists."}, **_ERRORS},
)
async def create_stream(
    request: Request, streamPrefix: str, body: CreateStreamRequest, principal: Writer
) -> JSONResponse:
    validate_stream_prefix(streamPrefix)
    async with audited(
        request, principal, "createStream", body, streamPrefix, None, body.reason, 201
    ):
        result = await runtime(request).service.create_stream(streamPrefix, body, body.ordering)
    return JSONResponse(result.to_wire(), status_code=201)


@router.post(
    "/streams/{streamPrefix}/groups/{consumerGroup}",
    operation_id="createCoordinatorGroup",
    tags=["Groups"],
    status_code=201,
    response_model=GroupResponse,
    responses={409: {"model": ErrorResponse, "description": "Group exists."}, **_ERRORS},
)
async def create_group(
    request: Request, keys: Keys, body: CreateGroupRequest, principal: Writer
) -> JSONResponse:
    async with audited(
        request, principal, "createGroup", body, keys.stream_prefix, keys.consumer_group,
        body.reason, 201,
    ):  # fmt: skip
        result = await runtime(request).service.create_group(keys, body, body.ordering)
    return JSONResponse(result.to_wire(), status_code=201)


@router.get(
    "/streams/{streamPrefix}/groups/{consumerGroup}",
    operation_id="getCoordinatorGroup",
    tags=["Groups"],
    response_model=GroupResponse,
    responses={404: {"model": ErrorResponse, "description": "Group not found."}, **_ERRORS},
)
async def get_group(request: Request, keys: Keys, principal: Reader) -> JSONResponse:
    group = await runtime(request).service.read_group(keys)
    return JSONResponse(views.group_response(group).to_wire())


@router.delete(
    "/streams/{streamPrefix}/groups/{consumerGroup}",
    operation_id="deleteCoordinatorGroup",
    tags=["Groups"],
    response_model=GroupResponse,
    responses={
        404: {"model": ErrorResponse, "description": "Group not found."},
        422: {"model": ErrorResponse, "description": "Group still has members."},
        **_ERRORS,
    },
)
async def delete_group(
    request: Request, keys: Keys, body: DeleteGroupRequest, principal: Writer
) -> JSONResponse:
    async with audited(
        request, principal, "deleteGroup", body, keys.stream_prefix, keys.consumer_group,
        body.reason,
    ):  # fmt: skip
        result = await runtime(request).service.delete_group(keys, body)
    return JSONResponse(result.to_wire())


@router.get(
    "/streams/{streamPrefix}/groups/{consumerGroup}/producer-routing",
    operation_id="getProducerRoutingMetadata",
    tags=["Producer Routing"],
    response_model=ProducerRoutingResponse,
    responses={404: {"model": ErrorResponse, "description": "Group not found."}, **_ERRORS},
)
async def producer_routing(request: Request, keys: Keys, principal: Reader) -> JSONResponse:
    service = runtime(request).service
    try:
        group = await service.read_group(keys)
    except Rejected as exc:
        if exc.error_code == "GROUP_NOT_FOUND":
            service.metrics.metadata_missing.inc()
        raise
    return JSONResponse(views.producer_routing(group).to_wire())
