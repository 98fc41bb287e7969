"""The audit log: one JSON line per admin mutation and per refused request.

Records go to the logger ``streamkit_server.audit`` (route it to its own
sink) and, with ``STREAMKIT_SERVER_AUDIT_STREAM``, to a capped Redis stream
(``streamkit_server.observability.audit_stream``).  A record names the principal (or the
username a failed Basic login tried), never a password, token or body: the
body is represented by its sha256, and only ``requestedBy``/``reason`` are
read out of it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

from streamkit_server.api.asgi import HttpMiddleware
from streamkit_server.auth.security import Principal, basic_username
from streamkit_server.observability.audit import MAX_RECORD_BYTES, audit_log, emit

__all__ = ["MAX_RECORD_BYTES", "REFUSALS", "AuditMiddleware", "audit_log", "audited"]

# Refusals worth a record: authentication, authorization, input, conflicts, limits.
REFUSALS: Final = frozenset({400, 401, 403, 404, 409, 413, 422, 429})


def _emit(scope: Scope, record: dict[str, Any]) -> None:
    app = scope.get("app")
    runtime = getattr(getattr(app, "state", None), "runtime", None)
    emit(record, getattr(runtime, "audit_stream", None))


def _accountability(body: bytes) -> tuple[str | None, str | None]:
    """``requestedBy`` and ``reason`` out of a JSON body, as the endpoint read them.

    Read from any body the body limit let through (padding with whitespace
    must not hide who asked), and parsed once.
    """
    if not body:
        return None, None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # deeply nested bodies are client input too
        return None, None
    if not isinstance(parsed, dict):
        return None, None
    by, reason = parsed.get("requestedBy"), parsed.get("reason")
    return (by if isinstance(by, str) else None, reason if isinstance(reason, str) else None)


def _error_code(answer: bytes) -> str | None:
    try:
        parsed = json.loads(answer) if answer else None
    except (ValueError, RecursionError):
        return None
    code = parsed.get("errorCode") if isinstance(parsed, dict) else None
    return code if isinstance(code, str) else None


def _base(scope: Scope, body: bytes, status: int, started: float) -> dict[str, Any]:
    route = scope.get("route")
    params = scope.get("path_params") or {}
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
    state = scope.get("state") or {}
    principal: Principal | None = state.get("principal")
    client = scope.get("client")
    requested_by, reason = _accountability(body)
    return {
        "action": route.operation_id if isinstance(route, APIRoute) else None,
        "bodySha256": hashlib.sha256(body).hexdigest() if body else None,
        "client": client[0] if client else None,
        "consumerGroup": params.get("consumerGroup"),
        "durationMs": round((time.perf_counter() - started) * 1000, 1),
        "method": scope.get("method"),
        "outcome": "success" if status < 400 else "refused",
        "principal": principal.username if principal else None,
        "principalTried": None if principal else basic_username(headers.get("authorization")),
        "reason": reason,
        "requestId": headers.get("x-request-id"),
        "requestedBy": requested_by,
        "roles": sorted(principal.roles) if principal else [],
        "route": route.path if isinstance(route, APIRoute) else None,
        "status": status,
        "streamPrefix": params.get("streamPrefix"),
    }


class AuditMiddleware(HttpMiddleware):
    """Audits every refused request (and every mutation ``audited`` marks)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        chunks: list[bytes] = []
        size = 0
        status = 500

        async def recording_receive() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                size += len(chunk)
                if size <= 1024 * 1024:  # the body limit answers 413 beyond that anyway
                    chunks.append(chunk)
            return message

        answer: list[bytes] = []
        emitted = False

        def emit_once() -> None:
            nonlocal emitted
            if emitted:
                return
            emitted = True
            state = scope["state"]
            if status in REFUSALS or state.get("audit_mutation"):
                try:
                    record = _base(scope, b"".join(chunks), status, started)
                    record["kind"] = "mutation" if state.get("audit_mutation") else "refusal"
                    record["errorCode"] = _error_code(b"".join(answer))
                    _emit(scope, record)
                except Exception:  # an audit bug must not drop the connection
                    audit_log.exception("could not write an audit record")

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                if status >= 400:
                    answer.append(message.get("body", b""))  # an ErrorResponse: small
                if not message.get("more_body", False):
                    # Written before the client sees the answer: whoever got a
                    # response can rely on its record being in the log already.
                    emit_once()
            await send(message)

        scope.setdefault("state", {})
        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            emit_once()  # a request that ended without a full response


@asynccontextmanager
async def audited(request: Request) -> AsyncIterator[None]:
    """Mark the request as an admin mutation: audited whatever its outcome."""
    request.state.audit_mutation = True
    yield
