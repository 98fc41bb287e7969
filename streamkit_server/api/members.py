"""The member API: ``sendConsumerHeartbeat``, the request a coordinator serves most.

One request path.  The route is declared like any other (the OpenAPI
document describes it from ``heartbeat``'s signature), and its ``handle``,
the ASGI interface every Starlette route has, serves every heartbeat.  What
FastAPI would do per request besides (the dependency solver, response
validation, a ``Response`` object) costs more than the heartbeat's own work,
so it is done here by hand, with the same rules in FastAPI's order: read the
body (JSON that does not parse is refused first), authenticate and authorize
(``deps.authorize_as``: Bearer, Basic with its login limiter, the insecure
member switch, the scope, the group's rate limit), validate the names, the
body and the member id, count a join, then ``CoordinatorService.heartbeat``.
Refusals are answered as ``ErrorResponse`` by the app's exception handlers
(api/errors.py).  The app's entry (api/entry.py) sends heartbeats straight
here from behind the coordinator's middlewares; the router never sees one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from streamkit.protocol import (
    API_PREFIX,
    ErrorResponse,
    HeartbeatAnswer,
    HeartbeatResponse,
)
from streamkit_server.api.bodies import HeartbeatRequest
from streamkit_server.api.deps import (
    AUTHORIZE,
    Caller,
    authorize_as,
    group_keys,
    rate_limit_join,
    runtime,
    valid_keys,
)
from streamkit_server.api.errors import is_json
from streamkit_server.auth.access import required_role
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.provisioning import validate_member_id

__all__ = ["OPERATION_ID", "HeartbeatRoute", "answer_json", "heartbeat_route", "router"]

#: The heartbeat's operationId (also the access matrix's key).
OPERATION_ID = "sendConsumerHeartbeat"
_JSON_HEADERS = [(b"content-type", b"application/json")]


class HeartbeatRoute(APIRoute):
    """The heartbeat operation, served by its own ASGI handler."""

    _lease_ttl_ms: int | None = None
    _lease_field = b""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            answer = await self._answer(request)
        except Exception as exc:
            await _render(request, exc, send)
            return
        headers = [(b"content-length", str(len(answer)).encode()), *_JSON_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    async def _answer(self, request: Request) -> bytes:
        scope = request.scope
        if scope["method"] != "POST":  # matched by path alone: Starlette's 405
            raise HTTPException(405, headers={"Allow": "POST"})
        # FastAPI's order: the body is read (and JSON that does not parse is
        # refused) before the route's checks, so the audit log sees its hash.
        raw = await _read_body(request.receive)
        content_type = request.headers.get("content-type")
        body = _model(raw, content_type)
        value = None if body is not None else _decode(raw, content_type)
        # Role, scope and the group's rate limit (deps.authorize, with the
        # route's role and names known here).
        params = scope["path_params"]
        prefix, group = params["streamPrefix"], params["consumerGroup"]
        rt = runtime(request)
        principal = await authorize_as(request, rt, required_role(OPERATION_ID), prefix, group)
        # Names before the body's fields, as FastAPI ran ``group_keys`` before
        # validating them (and with the insecure member switch, where no rate
        # limit checks the names).
        keys = valid_keys(rt, prefix, group)
        if body is None:
            body = _validate(value)
        member_id = params["memberId"]
        validate_member_id(member_id)
        # The member is bound to this name (None: the insecure member switch).
        name = None if principal is None else principal.username
        await rate_limit_join(rt, name, body)
        service = rt.service
        decided = await service.heartbeat(keys, member_id, body, name)
        return self._answer_json(decided, service.config.member_lease_ttl_ms)

    def _answer_json(self, decided: HeartbeatResponse, lease_ttl_ms: int) -> bytes:
        if lease_ttl_ms != self._lease_ttl_ms:
            self._lease_field = _lease_field(lease_ttl_ms)
            self._lease_ttl_ms = lease_ttl_ms
        return answer_json(decided, self._lease_field)


router = APIRouter(
    prefix=API_PREFIX, tags=["Members"], dependencies=[AUTHORIZE], route_class=HeartbeatRoute
)


# Declares the operation for the OpenAPI document (parameters, body, answer);
# ``HeartbeatRoute.handle`` serves it, so this is never called.
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
    memberId: str,
    body: HeartbeatRequest,
    keys: Annotated[GroupKeys, Depends(group_keys)],
    caller: Caller,
) -> HeartbeatResponse:
    raise NotImplementedError  # pragma: no cover - HeartbeatRoute.handle answers


def heartbeat_route() -> HeartbeatRoute:
    """The route object (the app's entry dispatches to it)."""
    (route,) = (r for r in router.routes if isinstance(r, HeartbeatRoute))
    return route


def _lease_field(lease_ttl_ms: int) -> bytes:
    """``,"memberLeaseTtlMs":<ttl>}``, as the answer model writes its last field."""
    dumped = HeartbeatAnswer(member_lease_ttl_ms=lease_ttl_ms).model_dump_json(by_alias=True)
    raw = dumped.encode()
    return b"," + raw[raw.rindex(b'"memberLeaseTtlMs"') :]


def answer_json(decided: HeartbeatResponse, lease_field: bytes) -> bytes:
    """The ``HeartbeatAnswer`` JSON: the response's, plus its last field appended
    (the same bytes as building and dumping the answer model, without doing so;
    tests/server/api/test_heartbeat_path.py compares them)."""
    # The serializer's bytes (``model_dump_json`` decodes them to a ``str``).
    dumped = decided.__pydantic_serializer__.to_json(decided, by_alias=True)
    return dumped[:-1] + lease_field


async def _read_body(receive: Receive) -> bytes:
    """The whole body (the body limit's 413 and the deadline's 408 are raised from here)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # a disconnect: nothing to answer
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _model(raw: bytes, content_type: str | None) -> HeartbeatRequest | None:
    """The body, validated in one pass; None if it is not a valid JSON heartbeat."""
    if raw and content_type and is_json(content_type):
        try:
            return HeartbeatRequest.model_validate_json(raw)
        except ValidationError:
            pass  # described by _decode and _validate, as FastAPI describes it
    return None


def _decode(raw: bytes, content_type: str | None) -> Any:
    """The body as FastAPI decodes a JSON body parameter, with its errors: JSON
    that does not parse is refused with the same ``RequestValidationError`` (or
    ``HTTPException``) any other route's would be."""
    if not raw:
        return None
    if not (content_type and is_json(content_type)):
        return raw  # FastAPI parses JSON media types only
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid", "loc": ("body", exc.pos),
            "msg": "JSON decode error", "input": {}, "ctx": {"error": exc.msg},
        }  # fmt: skip
        raise RequestValidationError([error]) from None
    except (ValueError, RecursionError):  # not UTF-8, or nested too deep
        raise HTTPException(400, "There was an error parsing the body") from None


def _validate(value: Any) -> HeartbeatRequest:
    """``value`` validated as FastAPI validates a body parameter, with its errors."""
    if value is None:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        return HeartbeatRequest.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from None


async def _render(request: Request, exc: Exception, send: Send) -> None:
    """Answer ``exc`` with the handler the app registered for it (api/errors.py)."""
    handlers: dict[Any, Any] = request.app.exception_handlers
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            response = await handler(request, exc)
            await response(request.scope, request.receive, send)
            return
    raise exc  # pragma: no cover - api/errors.py registers a handler for Exception
