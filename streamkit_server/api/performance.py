"""Per-route request figures: measured by a middleware, read by the console.

Every HTTP request is counted and timed under a bounded route label (its
operationId, else its path template; ``/console`` for the console's files and
``unmatched`` for paths no route serves, so a client cannot create labels).
The figures are the Prometheus metrics ``redis_stream_coord_http_*`` of this
process; ``getApiPerformance`` shows them as JSON with p50/p99 estimated from
the histogram buckets, the way ``histogram_quantile`` would.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamkit.protocol import API_PREFIX
from streamkit_server.api.asgi import HttpMiddleware
from streamkit_server.api.deps import AUTHORIZE, Caller, runtime
from streamkit_server.observability.metrics import Metrics

__all__ = ["RequestMetricsMiddleware", "route_label", "router"]

router = APIRouter(prefix=f"{API_PREFIX}/monitoring", tags=["Monitoring"], dependencies=[AUTHORIZE])

_CONSOLE = "/console"


def route_label(scope: Scope) -> str:
    route = scope.get("route")
    if isinstance(route, APIRoute):
        return route.operation_id or route.path
    path = str(scope.get("path", ""))
    if path == _CONSOLE or path.startswith(f"{_CONSOLE}/"):
        return _CONSOLE
    return "unmatched"


class RequestMetricsMiddleware(HttpMiddleware):
    """Counts and times every HTTP request (``Metrics.observe_request``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500  # an exception that escapes is answered 500 further out

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.observe_request(
                route_label(scope), str(scope.get("method", "?")), status,
                time.perf_counter() - started,
            )  # fmt: skip


@router.get("/api-performance", operation_id="getApiPerformance")
async def api_performance(request: Request, _p: Caller) -> JSONResponse:
    """Request count, errors and latency per route, since this process started."""
    rt = runtime(request)
    routes = [
        {
            "route": f.route,
            "method": f.method,
            "count": f.count,
            "clientErrors": f.client_errors,
            "serverErrors": f.server_errors,
            "meanMs": _round(f.mean_ms),
            "p50Ms": _round(f.p50_ms),
            "p99Ms": _round(f.p99_ms),
        }
        for f in rt.metrics.route_figures()
    ]
    return JSONResponse(
        {
            "coordinatorId": rt.coordinator_id,
            "startedAt": datetime.fromtimestamp(rt.started_at, tz=UTC)
            .isoformat()
            .replace("+00:00", "Z"),
            "routes": routes,
        }
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
