"""``/healthz``, ``/readyz`` and ``/metrics`` of a running app (``streamkit run --http``).

A deliberately tiny HTTP/1.1 server on anyio: three read-only ``GET``
routes, no framework, so probes need no extra dependency and cannot block
the event loop the listeners run on.  Off unless asked for (``--http`` /
``STREAMKIT_HTTP``): the port exposes group and member names.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import SocketStream, TaskStatus

from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.numerals import ascii_uint

if TYPE_CHECKING:
    from streamkit.app import StreamKit

__all__ = ["instrument", "parse_address", "ready", "serve_probes"]

log = logging.getLogger("streamkit.probes")

_MAX_REQUEST: Final = 8192
_READ_TIMEOUT_S: Final = 5.0


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9000`` for IPv6) -> (host, port); ValueError if malformed."""
    host, sep, port_text = value.rpartition(":")
    port = ascii_uint(port_text, 65_535)
    if not sep or not host or port is None:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), port


def ready(app: StreamKit) -> tuple[bool, str]:
    """Every member joined and holds a valid lease (or owns nothing); not while stopping."""
    if app.stopping:
        return False, "shutting down"
    if app.listeners and not app.members:
        return False, "not serving yet"
    now = monotonic_ms()
    for member in app.members:
        machine = member.machine
        if not machine.joined:
            return False, f"member {member.member_id} has not joined"
        if machine.reading and not machine.lease_valid(now):
            return False, f"member {member.member_id} has no valid lease"
    return True, "ready"


def instrument(app: StreamKit, registry: Any = None) -> Any:
    """Add Prometheus metrics to ``app`` (unless it has them); returns the registry."""
    from prometheus_client import REGISTRY

    from streamkit.observability.metrics import AppCollector, PrometheusMiddleware

    registry = REGISTRY if registry is None else registry
    if not any(isinstance(m, PrometheusMiddleware) for m in app.middlewares):
        app.add_middleware(PrometheusMiddleware(registry))
    registry.register(AppCollector(app))
    return registry


async def serve_probes(
    app: StreamKit,
    host: str,
    port: int,
    *,
    registry: Any = None,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the probes until cancelled; ``task_status`` gets the bound port."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    async with listener:
        bound = listener.extra(anyio.abc.SocketAttribute.local_port)
        log.info("probes and metrics on http://%s:%d/", host, bound)
        task_status.started(bound)

        async def handle(stream: SocketStream) -> None:
            async with stream:
                try:
                    with anyio.fail_after(_READ_TIMEOUT_S):
                        request = await _read_head(stream)
                    status, ctype, body = _route(app, registry, request)
                except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return
                except ValueError as exc:
                    status, ctype, body = 400, "text/plain", str(exc).encode()
                head = (
                    f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                )
                try:
                    await stream.send(head.encode() + body)
                except (anyio.BrokenResourceError, OSError):
                    pass

        await listener.serve(handle)


_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


async def _read_head(stream: SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        chunk = await stream.receive(4096)
        data += chunk
        if len(data) > _MAX_REQUEST:
            raise ValueError("request head too large")
    return data


def _route(app: StreamKit, registry: Any, request: bytes) -> tuple[int, str, bytes]:
    line = request.split(b"\n", 1)[0].decode("latin-1").strip()
    parts = line.split()
    if len(parts) != 3:
        raise ValueError("malformed request line")
    method, target, _ = parts
    path = target.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", b"only GET\n"
    if path == "/healthz":
        return 200, "text/plain", b"ok\n"
    if path == "/readyz":
        ok, why = ready(app)
        return (200 if ok else 503), "text/plain", why.encode() + b"\n"
    if path == "/metrics":
        if registry is None:
            return 404, "text/plain", b"metrics are off (install streamkit[metrics])\n"
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
    return 404, "text/plain", b"not found\n"
