"""The member API: ``sendConsumerHeartbeat``, the request a coordinator serves most.

One request path: a route of the app's own router, ahead of every other
route, whose ``handle`` is a plain ASGI handler.  FastAPI declares the
operation (parameters, body and answers go into the OpenAPI document from
``heartbeat``'s signature) and sets ``scope["route"]`` when it matches, so
request metrics and the audit log label heartbeats by their operationId;
what FastAPI would do per request besides (the dependency solver, response
validation, a ``Response`` object) costs more than the heartbeat's own work
and is done here by hand, with the same rules in the same order as every
other route: authenticate and authorize (``deps.authorize``: Bearer, Basic
with its login limiter, the insecure member switch), count against the
group's rate limit, validate the body and the member id, then
``CoordinatorService.heartbeat``.  Refusals are raised, and the app's
exception handlers (api/errors.py) answer them as ``ErrorResponse``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from streamkit.protocol import API_PREFIX, ErrorResponse, HeartbeatAnswer, HeartbeatResponse
from streamkit_server.api.bodies import HeartbeatRequest
from streamkit_server.api.deps import authorize, keys_for, runtime
from streamkit_server.api.errors import is_json
from streamkit_server.store.provisioning import validate_member_id

__all__ = ["OPERATION_ID", "PATH", "HeartbeatRoute", "add_heartbeat_route", "answer_json"]

#: The heartbeat's operationId (also the access matrix's key).
OPERATION_ID = "sendConsumerHeartbeat"
_GROUP = f"{API_PREFIX}/streams/{{streamPrefix}}/groups/{{consumerGroup}}"
PATH = f"{_GROUP}/members/{{memberId}}/heartbeat"
_JSON_HEADERS = [(b"content-type", b"application/json")]


# Declares the operation for the OpenAPI document (its name is the summary, so
# no docstring); ``HeartbeatRoute.handle`` serves it.
async def heartbeat(
    memberId: str, streamPrefix: str, consumerGroup: str, body: HeartbeatRequest
) -> HeartbeatResponse:
    raise NotImplementedError  # pragma: no cover - never called


class HeartbeatRoute(APIRoute):
    """The heartbeat operation, served by its own ASGI handler."""

    _lease_ttl_ms: int | None = None
    _lease_field = b""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":  # matched by path alone: Starlette's 405
            raise HTTPException(405, headers={"Allow": "POST"})
        request = Request(scope, receive)
        # Role, scope and the group's rate limit (deps.authorize).
        principal = await authorize(request)
        params = scope["path_params"]
        # Names before the body, as FastAPI ran ``group_keys`` before validating
        # it (and with the insecure member switch, where no rate limit checks them).
        keys = keys_for(request, params["streamPrefix"], params["consumerGroup"])
        body = await _parse(request)
        member_id = params["memberId"]
        validate_member_id(member_id)
        service = runtime(request).service
        # The member is bound to this name (None: the insecure member switch).
        name = None if principal is None else principal.username
        decided = await service.heartbeat(keys, member_id, body, name)
        answer = self._answer(decided, service.config.member_lease_ttl_ms)
        headers = [(b"content-length", str(len(answer)).encode()), *_JSON_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def _answer(self, decided: HeartbeatResponse, lease_ttl_ms: int) -> bytes:
        if lease_ttl_ms != self._lease_ttl_ms:
            self._lease_field = _lease_field(lease_ttl_ms)
            self._lease_ttl_ms = lease_ttl_ms
        return answer_json(decided, self._lease_field)


def _lease_field(lease_ttl_ms: int) -> bytes:
    """``,"memberLeaseTtlMs":<ttl>}``, as the answer model writes its last field."""
    dumped = HeartbeatAnswer(member_lease_ttl_ms=lease_ttl_ms).model_dump_json(by_alias=True)
    raw = dumped.encode()
    return b"," + raw[raw.rindex(b'"memberLeaseTtlMs"') :]


def answer_json(decided: HeartbeatResponse, lease_field: bytes) -> bytes:
    """The ``HeartbeatAnswer`` JSON: the response's, plus its last field appended
    (the same bytes as building and dumping the answer model, without doing so;
    tests/server/api/test_heartbeat_path.py compares them)."""
    return decided.model_dump_json(by_alias=True).encode()[:-1] + lease_field


async def _parse(request: Request) -> HeartbeatRequest:
    raw = await request.body()  # the body limit's 413 is raised from here
    content_type = request.headers.get("content-type")
    if raw and content_type and is_json(content_type):
        try:
            return HeartbeatRequest.model_validate_json(raw)
        except ValidationError:
            pass  # described below, as FastAPI describes a body it refuses
    return _as_fastapi(raw, content_type)


def _as_fastapi(raw: bytes, content_type: str | None) -> HeartbeatRequest:
    """Validate ``raw`` as FastAPI validates a JSON body parameter, with its errors:
    a body that is missing, not JSON or not sent as JSON is refused with the
    same ``RequestValidationError`` any other route's would be."""
    value: Any = None
    if raw:
        value = raw  # FastAPI parses JSON media types only
        if content_type and is_json(content_type):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                error = {
                    "type": "json_invalid", "loc": ("body", exc.pos),
                    "msg": "JSON decode error", "input": {}, "ctx": {"error": exc.msg},
                }  # fmt: skip
                raise RequestValidationError([error]) from None
            except (ValueError, RecursionError):  # not UTF-8, or nested too deep
                raise HTTPException(400, "There was an error parsing the body") from None
    if value is None:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        return HeartbeatRequest.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def add_heartbeat_route(app: FastAPI) -> None:
    """Add the heartbeat route; call it before any other, so it is matched first."""
    app.router.add_api_route(
        PATH,
        heartbeat,
        methods=["POST"],
        operation_id=OPERATION_ID,
        tags=["Members"],
        response_model=HeartbeatResponse,
        route_class_override=HeartbeatRoute,
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
