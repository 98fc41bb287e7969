"""The heartbeat route's plain case, answered without FastAPI's per-request work.

Heartbeats are nearly every request a coordinator serves.  Through FastAPI
each one pays for route matching over every route, the dependency solver,
the exception and exit-stack middlewares and a ``Response`` object: about a
fifth of the coordinator's CPU per heartbeat (docs/performance.md).  This
ASGI middleware answers the plain case itself (a Bearer token or the
insecure member switch, a JSON body that validates) with the same rules in
the same order: authenticate, authorize, validate names, count against the
rate limit, then ``CoordinatorService.heartbeat``.

Everything else goes to the FastAPI route, which stays the contract (it is
what the OpenAPI document describes): Basic credentials, failed
authentication, invalid names or bodies.  It is handed the request exactly
as received (the body is replayed), and nothing has been counted or written
for it yet, so the answer is the route's own.  Errors past that point (a
rate limit, a refusal of the core, Redis down) are rendered by the app's
exception handlers, the ones the route would have used.

It sits inside the request-id, request-metrics, audit and body-limit
middlewares, so heartbeats' X-Request-Ids are checked, heartbeats timed,
refusals audited and bodies capped as before.  And heartbeats enter the app
*at* those middlewares (``CoordinatorApp``): FastAPI's
and Starlette's own outer layers (the app call, the server-error, telemetry
and body-limit middlewares) would each wrap every heartbeat and its two
``send`` calls again, for nothing a heartbeat needs except the 500 of an
unexpected error, which the entry keeps (one ``ServerErrorMiddleware`` with
the app's own handler).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamkit.protocol import API_PREFIX, HeartbeatAnswer
from streamkit_server.api import members
from streamkit_server.api.bodies import HeartbeatRequest
from streamkit_server.api.deps import (
    check_scope,
    rate_limit_join,
    rate_limit_member,
    verified_principal,
)
from streamkit_server.api.errors import is_json
from streamkit_server.api.guards import RequestIdMiddleware
from streamkit_server.auth.access import required_role
from streamkit_server.auth.security import AuthError, Principal
from streamkit_server.errors import Rejected
from streamkit_server.runtime import Runtime
from streamkit_server.store.provisioning import (
    validate_consumer_group,
    validate_member_id,
    validate_stream_prefix,
)

__all__ = ["CoordinatorApp", "HeartbeatPath"]

# Starlette matches a ``{name}`` path segment as ``[^/]+`` of the decoded path.
_PATH = re.compile(
    rf"{re.escape(API_PREFIX)}/streams/([^/]+)/groups/([^/]+)/members/([^/]+)/heartbeat"
)
_JSON_HEADERS = [(b"content-type", b"application/json")]


def _heartbeat_match(scope: Scope) -> re.Match[str] | None:
    """The path's names if ``scope`` is a request the heartbeat path looks at."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    return _PATH.fullmatch(scope["path"])


class CoordinatorApp(FastAPI):
    """FastAPI, with heartbeats entering at the coordinator's own middlewares."""

    _heartbeats: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self._heartbeats
        if entry is None and self.middleware_stack is not None:
            entry = self._heartbeats = self._heartbeat_entry(self.middleware_stack)
        if entry is not None and _heartbeat_match(scope) is not None:
            scope["app"] = self  # what Starlette.__call__ sets (exception handlers)
            await entry(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    @staticmethod
    def _heartbeat_entry(stack: ASGIApp) -> ASGIApp | None:
        """The built stack from the outermost coordinator middleware down, under
        the top of the stack's own ``ServerErrorMiddleware``; None if not found
        (the app then serves heartbeats through its whole stack)."""
        if not isinstance(stack, ServerErrorMiddleware):
            return None
        node: Any = stack.app
        for _ in range(16):  # the built stack is a short chain of ``.app``
            # The outermost coordinator middleware: heartbeats pass every one
            # of them (the request-id guard first), only Starlette's are skipped.
            if isinstance(node, RequestIdMiddleware):
                return ServerErrorMiddleware(node, handler=stack.handler, debug=stack.debug)
            node = getattr(node, "app", None)
        return None


class _Fallback(Exception):
    """Not the plain case: the FastAPI route answers (nothing counted yet)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # the label of ``heartbeat_full_route_total``


class HeartbeatPath:
    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime
        # The route FastAPI would have matched: metrics and the audit label by it.
        (self._route,) = (
            r
            for r in members.router.routes
            if isinstance(r, APIRoute) and r.operation_id == members.OPERATION_ID
        )
        # The role the access matrix asks of the route (MEMBER).
        self._role = required_role(members.OPERATION_ID)
        # `,"memberLeaseTtlMs":<ttl>}`, as the answer model writes it.
        sample = HeartbeatAnswer(member_lease_ttl_ms=runtime.settings.member_lease_ttl_ms)
        dumped = sample.model_dump_json(by_alias=True).encode()
        self._lease_field = b"," + dumped[dumped.rindex(b'"memberLeaseTtlMs"') :]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _heartbeat_match(scope)
        if match is None:
            await self.app(scope, receive, send)
            return
        body = b""
        try:
            body = await _read_body(receive)  # the body limit may raise its 413
            answer = await self._answer(scope, match, body)
        except _Fallback as fallback:
            self.runtime.metrics.heartbeats_routed.labels(fallback.reason).inc()
            await self.app(scope, _replay(body, receive), send)
            return
        except Exception as exc:
            await _render(scope, receive, send, exc)
            return
        await _send_json(send, 200, answer)

    async def _answer(self, scope: Scope, match: re.Match[str], body: bytes) -> bytes:
        """The answer's JSON; ``_Fallback`` before anything is counted or written."""
        prefix, group, member_id = match.groups()
        headers = Headers(scope=scope)
        principal = await self._caller(headers.get("authorization"))
        if not is_json(headers.get("content-type", "")):
            raise _Fallback("invalid_request")
        try:
            # The route's order: names before the rate limit counts anything.
            validate_stream_prefix(prefix)
            validate_consumer_group(group)
            request = HeartbeatRequest.model_validate_json(body)
            validate_member_id(member_id)
        except (Rejected, ValidationError):
            raise _Fallback("invalid_request") from None
        params = {"streamPrefix": prefix, "consumerGroup": group, "memberId": member_id}
        scope["path_params"] = params
        scope["route"] = self._route
        scope["endpoint"] = self._route.endpoint
        if principal is not None:
            scope.setdefault("state", {})["principal"] = principal
        rt = self.runtime
        check_scope(principal, prefix, group)  # as the route's authorize does
        if principal is not None:  # the insecure member switch skips the limit too
            await rate_limit_member(rt, prefix, group)
        service = rt.service
        name = None if principal is None else principal.username
        await rate_limit_join(rt, name, request)
        decided = await service.heartbeat(service.keys(prefix, group), member_id, request, name)
        # ``HeartbeatAnswer`` is the response plus one last field: appended to
        # the response's JSON, the same bytes as building and dumping the
        # answer model (tests/server/api/test_heartbeat_path.py compares them).
        return decided.model_dump_json(by_alias=True).encode()[:-1] + self._lease_field

    async def _caller(self, authorization: str | None) -> Principal | None:
        """The member calling, when no failure needs the route's answer."""
        rt = self.runtime
        if rt.settings.insecure_member_api:
            return None  # the unsafe switch, warned at start-up
        if authorization is None or authorization[:7].lower() != "bearer ":
            # Basic has a login limiter to consult: the route does that.
            raise _Fallback("not_bearer")
        try:
            principal = await verified_principal(rt, authorization)
        except AuthError:
            raise _Fallback("refused") from None
        if principal is None or self._role is None or self._role not in principal.roles:
            raise _Fallback("refused")
        return principal


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # a disconnect: the route sees the same when it reads
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replaying() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode()), *_JSON_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _render(scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
    """Answer ``exc`` with the handler the app registered for it (api/errors.py)."""
    handlers: dict[Any, Any] = scope["app"].exception_handlers
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)
            return
    raise exc  # pragma: no cover - api/errors.py registers a handler for Exception
