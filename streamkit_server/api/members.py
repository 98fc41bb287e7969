"""The member API: ``sendConsumerHeartbeat``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from streamkit.protocol import (
    API_PREFIX,
    ErrorResponse,
    HeartbeatAnswer,
    HeartbeatResponse,
)
from streamkit_server.api.bodies import HeartbeatRequest
from streamkit_server.api.deps import AUTHORIZE, Caller, group_keys, rate_limit_join, runtime
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.provisioning import validate_member_id

#: The heartbeat's operationId (also the lean path's and the access matrix's key).
OPERATION_ID = "sendConsumerHeartbeat"

router = APIRouter(prefix=API_PREFIX, tags=["Members"], dependencies=[AUTHORIZE])


@router.post(
    "/streams/{streamPrefix}/groups/{consumerGroup}/members/{memberId}/heartbeat",
    operation_id=OPERATION_ID,
    response_model=HeartbeatResponse,
    responses={
        400: {"model": ErrorResponse, "description": "Invalid request."},
        404: {"model": ErrorResponse, "description": "Group not found (never auto-created)."},
        409: {
            "model": ErrorResponse,
            "description": "MEMBER_ID_IN_USE: a live process of another incarnation holds "
            "this member id (streamkit clients only).",
        },
        503: {"model": ErrorResponse, "description": "Coordinator terminating; retry another."},
    },
)
async def heartbeat(
    request: Request,
    memberId: str,
    body: HeartbeatRequest,
    keys: Annotated[GroupKeys, Depends(group_keys)],
    caller: Caller,
) -> Response:
    validate_member_id(memberId)
    service = runtime(request).service
    # "anonymous": the insecure member switch, where no caller is known.
    principal = None if caller.method == "none" else caller.username
    await rate_limit_join(runtime(request), principal, body)
    decided = await service.heartbeat(keys, memberId, body, principal)
    response = HeartbeatAnswer.model_construct(
        **dict(decided), member_lease_ttl_ms=service.config.member_lease_ttl_ms
    )
    # Serialised once by pydantic-core; skips FastAPI's response re-validation
    # on the hottest path.
    return Response(response.model_dump_json(by_alias=True), media_type="application/json")
