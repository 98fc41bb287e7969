"""Bounds on what a caller sends: header size and time, body time, the request id.

Three layers, each cheap, so a slow or oversized request costs the server a
bounded amount of memory and time (issue 36, findings 3 and 12):

* ``guarded_protocol``: uvicorn's HTTP protocol with a header deadline (a
  connection that has not sent complete request headers within
  ``header_timeout_s`` of its first byte, or of opening, is closed) and a
  header size limit (more than ``max_header_bytes`` of request line and
  headers: ``431`` and close).  uvicorn itself has neither for httptools,
  and no header deadline for h11.
* ``BodyDeadlineMiddleware``: the whole body must arrive within
  ``body_timeout_s`` of the first read, else ``408 REQUEST_TIMEOUT``.
* ``RequestIdMiddleware``: ``X-Request-Id`` is kept only if it is 1..128
  characters of ``[A-Za-z0-9._:-]``; any other value is replaced by a
  generated id before anything (log, audit record, audit stream) reads it.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from typing import Any, Final

import h11
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamkit_server.api.asgi import HttpMiddleware

__all__ = [
    "MAX_REQUEST_ID",
    "BodyDeadlineMiddleware",
    "RequestIdMiddleware",
    "guarded_protocol",
    "safe_request_id",
]

MAX_REQUEST_ID: Final = 128
_REQUEST_ID: Final = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_REQUEST_ID}}}")


def safe_request_id(raw: bytes | None) -> bytes:
    """``raw`` if it has the safe shape, else a fresh ``gen-<16 hex>`` id."""
    if raw is not None and len(raw) <= MAX_REQUEST_ID:
        text = raw.decode("latin-1")
        if _REQUEST_ID.fullmatch(text):
            return raw
    return f"gen-{secrets.token_hex(8)}".encode()


class RequestIdMiddleware:
    """Replace an unsafe or missing ``X-Request-Id`` in the scope (outermost)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"x-request-id"]
            given = [v for k, v in scope.get("headers", ()) if k == b"x-request-id"]
            # Several ids, or one of the wrong shape, are as good as none.
            kept = safe_request_id(given[0] if len(given) == 1 else None)
            headers.append((b"x-request-id", kept))
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


class BodyDeadlineMiddleware(HttpMiddleware):
    """Refuse (``408``) a body that has not fully arrived ``timeout_s`` after the first read."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        super().__init__(app)
        self.timeout_s = timeout_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        deadline: float | None = None

        async def timed_receive() -> Message:
            nonlocal deadline
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.timeout_s
            # asyncio's timeout, not anyio's cancel scope: every request with a
            # body pays it, and it costs a third as much (like ratelimit.py's).
            try:
                async with asyncio.timeout_at(deadline):
                    return await receive()
            except TimeoutError:
                # An HTTPException passes FastAPI's body reading unchanged (like
                # the body limit's 413), so the answer is an ErrorResponse.
                raise HTTPException(
                    408, f"the request body did not arrive within {self.timeout_s:g} s"
                ) from None

        await self.app(scope, timed_receive, send)


def _too_large(limit: int) -> bytes:
    body = json.dumps(
        {
            "status": "431",
            "errorCode": "REQUEST_HEADER_FIELDS_TOO_LARGE",
            "message": f"request line and headers exceed {limit} bytes",
        }
    ).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


def guarded_protocol(base: type[Any], header_timeout_s: float, max_header_bytes: int) -> type[Any]:
    """``base`` (a uvicorn HTTP protocol class) with a header deadline and size limit.

    Headers are pending from a connection's opening, and from the first byte
    of each next request, until they are complete: h11 says so with its
    client state (``IDLE``), httptools with its parser callbacks.  A body, or
    an answer sent before the body was read, is not headers.
    """

    class Guarded(base):  # type: ignore[misc]
        _timer: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _parsing_headers = True  # httptools: between on_message_begin and headers complete

        def _pending(self) -> bool:
            conn = getattr(self, "conn", None)
            if isinstance(conn, h11.Connection):
                return conn.their_state is h11.IDLE
            return self._parsing_headers

        def on_message_begin(self) -> None:
            self._parsing_headers = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._parsing_headers = False
            super().on_headers_complete()

        def _arm(self) -> None:
            if self._timer is None:
                self._timer = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self._pending() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm()  # a connection that never sends a byte is closed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._pending():
                self._disarm()
                self._header_bytes = 0
                return
            self._arm()
            self._header_bytes += len(data)
            if self._header_bytes > max_header_bytes and not self.transport.is_closing():
                self.transport.write(_too_large(max_header_bytes))
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


_UNSAFE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS: Final = {"http": "80", "https": "443"}


def _netloc(scheme: str, host: str) -> str:
    host = host.strip().lower()
    port = _DEFAULT_PORTS.get(scheme)
    return host[: -len(port) - 1] if port and host.endswith(f":{port}") else host


class SameOriginMiddleware:
    """Refuse (``403 CROSS_ORIGIN_REQUEST``) a mutation a browser sends from another origin.

    A form on a foreign page can POST here with Basic credentials the browser
    has cached; browsers mark such requests with ``Origin`` (and
    ``Sec-Fetch-Site``).  Programs (consumers, the CLI, curl) send neither and
    pass; the console is same-origin.  Behind a proxy that rewrites ``Host``,
    ``X-Forwarded-Host`` is compared too (a cross-origin page cannot set it
    without a CORS preflight, which this server never grants).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") in _UNSAFE_METHODS:
            problem = self._problem(scope)
            if problem is not None:
                from streamkit_server.api.errors import error_response  # no import cycle

                response = error_response(403, "CROSS_ORIGIN_REQUEST", problem)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _problem(scope: Scope) -> str | None:
        raw = scope.get("headers", ())
        # Programs send neither header: only the two are looked for (the last
        # of each, as a dict of them keeps), not every header decoded.
        origin_raw = site = None
        for k, v in raw:
            if k == b"origin":
                origin_raw = v
            elif k == b"sec-fetch-site":
                site = v
        if origin_raw is None:
            if site in (b"cross-site", b"same-site"):
                return "a browser sent this change from another site; use the console"
            return None
        headers = {k: v.decode("latin-1") for k, v in raw}
        origin = origin_raw.decode("latin-1")
        scheme, sep, rest = origin.partition("://")
        if not sep:
            return f"Origin {origin[:100]!r} is not this server; changes are same-origin only"
        seen = _netloc(scheme, rest.split("/", 1)[0])
        hosts = [headers.get(b"host"), headers.get(b"x-forwarded-host")]
        if any(h is not None and _netloc(scheme, h.split(",")[0]) == seen for h in hosts):
            return None
        return f"Origin {origin[:100]!r} is not this server; changes are same-origin only"
