"""Every error as ``ErrorResponse`` JSON: ``{status, errorCode, message}``.

``status`` is the HTTP status code as a string (``"400"``), for every error.
Nothing a client can send is answered 500: validation, routing, method, body
size and JSON errors all map to 4xx here.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import redis.asyncio
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    MasterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamkit.protocol import ErrorResponse
from streamkit_server.api.asgi import HttpMiddleware
from streamkit_server.auth.ratelimit import RateLimited
from streamkit_server.auth.security import AuthError
from streamkit_server.coordination.gate import CoordinatorSuspended, CoordinatorTerminating
from streamkit_server.errors import ApiError, Rejected
from streamkit_server.store.mutex import MutexTimeout
from streamkit_server.store.records import StoreError

__all__ = [
    "BodyLimitMiddleware",
    "documented",
    "error_response",
    "install_error_handlers",
    "is_command_refusal",
    "is_json",
]

log = logging.getLogger("streamkit_server.api")

_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    408: "REQUEST_TIMEOUT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "UNPROCESSABLE",
    429: "TOO_MANY_REQUESTS",
}


#: The HTTP status of every error code the service and the core raise
#: (``Rejected``): the one place where a refusal becomes a status.
STATUS_BY_CODE: dict[str, int] = {
    "INVALID_STREAM_PREFIX": 400,
    "INVALID_CONSUMER_GROUP": 400,
    "INVALID_MEMBER_ID": 400,
    "INVALID_TARGET_SHARD_COUNT": 400,
    "INVALID_RETENTION": 400,
    "GROUP_NOT_FOUND": 404,
    "TOO_MANY_REQUESTS": 429,
    "STREAM_NOT_FOUND": 404,
    "MIGRATION_NOT_FOUND": 404,
    "DEAD_LETTER_NOT_FOUND": 404,
    "TOO_MANY_MEMBERS": 400,
    "GROUP_ALREADY_EXISTS": 409,
    "MEMBER_ID_IN_USE": 409,
    "STREAM_ALREADY_EXISTS": 409,
    "STREAM_KEYS_EXIST": 409,
    "ACTIVE_MIGRATION_EXISTS": 409,
    "SHARD_COUNT_MISMATCH": 409,
    "ORDERING_MISMATCH": 409,
    "NO_CONSUMER_GROUPS": 409,
    "LAYOUT_CHANGED": 409,
    "REPLAY_NEEDS_PARTITION_KEY": 409,
    "GROUP_NOT_INACTIVE": 422,
    "SHARD_COUNT_UNCHANGED": 422,
    "ROLLBACK_NOT_ALLOWED": 422,
    "DEAD_LETTER_NOT_REPLAYED": 422,
    # Server-side conditions an operator or a retry resolves.
    "COORDINATOR_BUSY": 503,
    "LAYOUT_DIVERGED": 503,
    "METADATA_CORRUPT": 503,
    "REDIS_STREAM_PROVISIONING_FAILED": 503,
}
#: Codes whose answer tells the client when to retry.
_RETRY_AFTER = frozenset({"COORDINATOR_BUSY"})


def error_response(
    status_code: int, error_code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorResponse(status=str(status_code), error_code=error_code, message=message)
    return JSONResponse(body.to_wire(), status_code=status_code, headers=headers)


#: What every operation behind ``AUTHORIZE`` may answer, in the same words.
CALLER_ERRORS: Final[dict[int, str]] = {401: "Authentication required.", 403: "Role missing."}


def documented(texts: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """An operation's ``responses=``: each status documented as an ``ErrorResponse``."""
    return {code: {"model": ErrorResponse, "description": text} for code, text in texts.items()}


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(part) for part in error.get("loc", ()))
    msg = error.get("msg", "invalid value")
    if error.get("type") == "json_invalid":
        ctx = error.get("ctx") or {}
        return f"malformed JSON body at position {loc.split('.')[-1]}: {ctx.get('error', msg)}"
    if error.get("type") == "missing":
        return f"{loc}: field required"
    return f"{loc}: {msg}"


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    code = "INVALID_REQUEST"
    if any(e.get("type") == "json_invalid" for e in errors):
        code = "MALFORMED_JSON"
    message = "; ".join(_describe(e) for e in errors[:5]) or "invalid request"
    if len(errors) > 5:
        message += f" (and {len(errors) - 5} more)"
    content_type = request.headers.get("content-type", "")
    body_error = any(tuple(e.get("loc", ()))[:1] == ("body",) for e in errors)
    if body_error and not is_json(content_type):
        # FastAPI does not parse a body declared as something else (curl -d
        # sends form encoding), so the real problem is the header.
        shown = f"{content_type!r}" if content_type else "none"
        message = (
            f"the request body must be JSON sent with the header "
            f"'Content-Type: application/json' (Content-Type was {shown}); {message}"
        )
    return error_response(400, code, message)


def is_json(content_type: str) -> bool:
    """A JSON media type, as FastAPI parses a body (``application/json``, ``*+json``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif status == 413:
        message = "request body is larger than the configured limit"
    else:
        message = str(exc.detail)
    headers = dict(exc.headers) if exc.headers else None
    return error_response(status, _HTTP_CODES.get(status, f"HTTP_{status}"), message, headers)


async def _api(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status_code, exc.error_code, exc.message, exc.headers or None)


async def _rejected(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Rejected)
    headers = {"Retry-After": "1"} if exc.error_code in _RETRY_AFTER else None
    if isinstance(exc, RateLimited):
        headers = {"Retry-After": str(exc.retry_after_s)}
    return error_response(status_for(exc), exc.error_code, exc.message, headers)


async def _auth(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    return error_response(401, "UNAUTHORIZED", exc.message, {"WWW-Authenticate": exc.challenge})


async def _terminating(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "COORDINATOR_TERMINATING", str(exc), {"Retry-After": "1"})


async def _suspended(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "COORDINATOR_TIMINGS_CONFLICT", str(exc), {"Retry-After": "1"})


async def _busy(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "COORDINATOR_BUSY", str(exc), {"Retry-After": "1"})


async def _store(request: Request, exc: Exception) -> JSONResponse:
    # 503, not 409/500: the request may be fine and nothing the client changes
    # makes it succeed; an operator must repair or upgrade, then retries work.
    assert isinstance(exc, StoreError)
    log.error("refusing to use group metadata: %s", exc)
    return error_response(503, exc.error_code, str(exc))


async def _redis(request: Request, exc: Exception) -> JSONResponse:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.metrics.redis_errors.inc()
        if isinstance(exc, ReadOnlyError) and isinstance(runtime.client, redis.asyncio.Redis):
            # After a failover the pooled connections may still lead to the
            # old primary, now a replica: drop them, so the next command
            # connects to whatever the Redis URL points at now.
            await runtime.client.connection_pool.disconnect()
        elif isinstance(exc, RedisConnectionError) and isinstance(
            runtime.client, redis.asyncio.Redis
        ):
            # A Redis that restarted leaves every idle pooled connection dead,
            # each good for one more failed command: drop them, so the client's
            # retry (Retry-After) reconnects instead of failing again.  Only the
            # idle ones: a command in flight on another connection may be fine.
            await runtime.client.connection_pool.disconnect(inuse_connections=False)
    log.warning("Redis unavailable: %s", exc)
    return error_response(
        503, "REDIS_UNAVAILABLE", f"Redis is unavailable: {exc}", {"Retry-After": "1"}
    )


async def _out_of_memory(request: Request, exc: Exception) -> JSONResponse:
    # Redis at maxmemory (noeviction) refuses every write, so nothing was
    # changed (a script fails at its first write, before any).  Members keep
    # what their leases allow and retry; nothing the client changes helps.
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.metrics.redis_errors.inc()
    log.error("Redis is out of memory and refuses writes: %s", exc)
    return error_response(
        503,
        "REDIS_OUT_OF_MEMORY",
        "Redis is at maxmemory and refuses writes; nothing was changed. "
        "Free memory or raise maxmemory, then retry",
        {"Retry-After": "1"},
    )


def is_command_refusal(exc: BaseException) -> bool:
    """Redis refused a command itself (renamed, disabled or denied by an ACL).

    Start-up checks every command the coordinator needs; this catches what
    changed afterwards (an ACL edit, a managed-Redis switch).
    """
    if isinstance(exc, NoPermissionError):
        return True
    text = str(exc).lower()
    return isinstance(exc, ResponseError) and text.startswith(
        ("unknown command", "unknown subcommand", "err unknown command")
    )


async def _response_error(request: Request, exc: Exception) -> JSONResponse:
    if not is_command_refusal(exc):
        return await _unexpected(request, exc)
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.metrics.compatibility_failures.labels("redis_command").inc()
    log.error("Redis refused a command the coordinator needs: %s", exc)
    # 503: nothing the client changes helps; an operator restores the command.
    return error_response(
        503,
        "REDIS_COMMAND_UNSUPPORTED",
        f"Redis refused a command the coordinator needs: {exc}",
        {"Retry-After": "1"},
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, "INTERNAL_ERROR", "internal error; see the coordinator log")


def status_for(exc: BaseException) -> int:
    """The HTTP status the handlers above answer ``exc`` with (for the audit log)."""
    if isinstance(exc, ApiError):
        return exc.status_code
    if isinstance(exc, Rejected):
        # An unmapped code is a bug of ours, not the client's: 500 says so.
        return STATUS_BY_CODE.get(exc.error_code, 500)
    if isinstance(exc, AuthError):
        return 401
    if isinstance(
        exc,
        CoordinatorTerminating
        | CoordinatorSuspended
        | MutexTimeout
        | StoreError
        | RedisConnectionError
        | RedisTimeoutError
        | ReadOnlyError
        | MasterDownError
        | OutOfMemoryError,
    ) or is_command_refusal(exc):
        return 503
    return 500


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(Rejected, _rejected)
    app.add_exception_handler(AuthError, _auth)
    app.add_exception_handler(CoordinatorTerminating, _terminating)
    app.add_exception_handler(CoordinatorSuspended, _suspended)
    app.add_exception_handler(MutexTimeout, _busy)
    app.add_exception_handler(StoreError, _store)
    app.add_exception_handler(RedisConnectionError, _redis)
    app.add_exception_handler(RedisTimeoutError, _redis)
    # A Redis failover in progress (a demoted primary, a replica without its
    # primary): retryable, like an unreachable Redis, never a 500.
    app.add_exception_handler(ReadOnlyError, _redis)
    app.add_exception_handler(MasterDownError, _redis)
    app.add_exception_handler(OutOfMemoryError, _out_of_memory)
    app.add_exception_handler(ResponseError, _response_error)
    app.add_exception_handler(Exception, _unexpected)


class BodyLimitMiddleware(HttpMiddleware):
    """Answer 413 (as ErrorResponse) for bodies above ``max_bytes``.

    A declared Content-Length is checked before the app runs; a chunked body
    is counted while it is read and cut off with the same 413.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0:
                    response = error_response(400, "BAD_REQUEST", "invalid Content-Length header")
                    await response(scope, receive, send)
                    return
                if declared > self.max_bytes:
                    await self._too_large(declared)(scope, receive, send)
                    return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI re-raises HTTPException from body reading, so it
                    # reaches the 413 handler above.
                    raise HTTPException(413, "request body too large")
            return message

        await self.app(scope, counting_receive, send)

    def _too_large(self, size: int) -> JSONResponse:
        return error_response(
            413,
            "PAYLOAD_TOO_LARGE",
            f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes",
        )
