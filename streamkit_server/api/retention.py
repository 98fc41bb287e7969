"""A stream's retention: read it (READ) and change it (WRITE).

streamkit extensions, not in the reference contract.  What retention does
(never trimming what a group still needs) is in
``streamkit_server/coordination/retention.py``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from streamkit.protocol import API_PREFIX
from streamkit_server.api.audit import audited
from streamkit_server.api.bodies import SetRetentionRequest
from streamkit_server.api.deps import AUTHORIZE, Caller, runtime
from streamkit_server.api.errors import CALLER_ERRORS, documented
from streamkit_server.coordination.retention import read_retention, set_retention
from streamkit_server.store.provisioning import validate_stream_prefix

router = APIRouter(prefix=API_PREFIX, tags=["Retention"], dependencies=[AUTHORIZE])


_COMMON = {
    400: "Invalid request (INVALID_REQUEST, INVALID_RETENTION).",
    **CALLER_ERRORS,
    404: "Stream not found (STREAM_NOT_FOUND).",
}


@router.get(
    "/streams/{streamPrefix}/retention",
    operation_id="getStreamRetention",
    responses=documented(_COMMON),
)
async def get_retention(request: Request, streamPrefix: str, _p: Caller) -> JSONResponse:
    """The stream's own retention, the one that applies, and where it comes from."""
    validate_stream_prefix(streamPrefix)
    view = await read_retention(runtime(request).service, streamPrefix)
    return JSONResponse(view.to_wire(streamPrefix))


@router.put(
    "/streams/{streamPrefix}/retention",
    operation_id="setStreamRetention",
    responses=documented({**_COMMON, 503: "Coordinator terminating or busy."}),
)
async def put_retention(
    request: Request, streamPrefix: str, body: SetRetentionRequest, _p: Caller
) -> JSONResponse:
    """Set the stream's retention; both fields null: none, even over the default."""
    validate_stream_prefix(streamPrefix)
    async with audited(request):
        view = await set_retention(
            runtime(request).service, streamPrefix, body.policy(), body.requested_by, body.reason
        )
    return JSONResponse(view.to_wire(streamPrefix))
