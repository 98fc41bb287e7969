"""A second, loopback-only listener that serves ``GET /metrics`` without credentials.

For scrapers that cannot send credentials (a node agent or a sidecar on the
same host).  It speaks just enough HTTP/1.1 for a scrape: one request per
connection, ``GET``/``HEAD /metrics``, everything else 404/405.  The main
port's ``/metrics`` keeps requiring ``READ``.  ``ServerSettings`` refuses a
non-loopback address, since the labels name every stream and group.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["MetricsListener"]

_HEAD_LIMIT: Final = 8192
_READ_TIMEOUT_S: Final = 5.0


def _answer(status: str, content_type: str, body: bytes, *, head: bool = False) -> bytes:
    lines = [
        f"HTTP/1.1 {status}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head else body)


class MetricsListener:
    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the kernel's pick for 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, limit=_HEAD_LIMIT
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            parts = head.split(b"\r\n", 1)[0].split()
            method = parts[0] if parts else b""
            path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
            if path != b"/metrics":
                answer = _answer("404 Not Found", "text/plain", b"only /metrics is served here\n")
            elif method not in (b"GET", b"HEAD"):
                answer = _answer("405 Method Not Allowed", "text/plain", b"GET /metrics\n")
            else:
                body = generate_latest(self._registry)
                answer = _answer("200 OK", CONTENT_TYPE_LATEST, body, head=method == b"HEAD")
            writer.write(answer)
            await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ConnectionError,
        ):
            pass  # a client that went away or sent garbage: just close
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
