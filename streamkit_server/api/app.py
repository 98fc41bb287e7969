"""The FastAPI application factory."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware import Middleware

from streamkit.protocol import HealthStatus
from streamkit_server.api import (
    admin,
    auth,
    autoscaling,
    dead_letters,
    grafana,
    members,
    monitoring,
    performance,
    resharding,
    retention,
)
from streamkit_server.api.audit import AuditMiddleware
from streamkit_server.api.console import mount_console
from streamkit_server.api.deps import authorize
from streamkit_server.api.entry import CoordinatorApp
from streamkit_server.api.errors import BodyLimitMiddleware, install_error_handlers
from streamkit_server.api.guards import (
    BodyDeadlineMiddleware,
    RequestIdMiddleware,
    SameOriginMiddleware,
)
from streamkit_server.api.links import add_links
from streamkit_server.coordination.autoscaling import LagSampler
from streamkit_server.runtime import Runtime
from streamkit_server.settings import ServerSettings

__all__ = ["create_app"]


_VALIDATION_REF = "#/components/schemas/HTTPValidationError"
_ERROR_REF = "#/components/schemas/ErrorResponse"


def _declare_400_not_422(schema: dict[str, Any]) -> None:
    """Declare the 400 ``ErrorResponse`` invalid input really gets (api/errors.py).

    FastAPI adds a 422 ``HTTPValidationError`` to every operation with
    parameters; this server never sends that body.  Declared 422s with an
    ``ErrorResponse`` (rule refusals such as SHARD_COUNT_UNCHANGED) stay.
    """
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            declared = responses.get("422", {})
            ref = declared.get("content", {}).get("application/json", {}).get("schema", {})
            if ref.get("$ref") == _VALIDATION_REF:
                del responses["422"]
                responses.setdefault(
                    "400",
                    {
                        "description": "Invalid request (INVALID_REQUEST and friends).",
                        "content": {"application/json": {"schema": {"$ref": _ERROR_REF}}},
                    },
                )
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)


def create_app(
    settings: ServerSettings, *, admin_password: str, token_secret: bytes | None
) -> FastAPI:
    """Build the app; Redis is connected by the lifespan (``runtime.start``).

    ``token_secret`` None: the secret shared through Redis is used (see
    ``streamkit_server.auth.token_secret``).
    """
    runtime = Runtime(settings, admin_password, token_secret)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        runtime.metrics.detail.cap = settings.metrics_series_cap
        runtime.metrics.detail.lease_ttl_ms = settings.member_lease_ttl_ms
        sampler = LagSampler(
            runtime.service, runtime.client, runtime.metrics.detail,
            settings.lag_sample_interval_ms,
        )  # fmt: skip
        app.state.lag_sampler = sampler
        sampler.start()
        try:
            yield
        finally:
            await sampler.stop()
            await runtime.stop()

    # The coordinator's own middlewares, outermost first; they wrap the whole
    # app, heartbeats included (api/entry.py).
    outer = [
        # Outermost: nothing downstream (log, audit record, audit stream) sees
        # an X-Request-Id of unsafe shape or size.
        Middleware(RequestIdMiddleware),
        # Outside even the audit: its time is part of what a client waits for.
        Middleware(performance.RequestMetricsMiddleware, metrics=runtime.metrics),
        # Outside the body limit, so it also sees its 413s.
        Middleware(AuditMiddleware),
        # Form posts from foreign pages (cached Basic credentials): refused, and audited.
        Middleware(SameOriginMiddleware),
        Middleware(BodyDeadlineMiddleware, timeout_s=settings.body_timeout_ms / 1000),
        Middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes),
    ]
    app = CoordinatorApp(
        outer=outer,
        # Heartbeats are nearly every request: their route is tried first.
        first=members.heartbeat_route(),
        title="Redis Stream Coordinator API (streamkit)",
        version="v1",
        lifespan=lifespan,
        # Swagger UI loads its scripts from a CDN: served only when asked for.
        docs_url="/docs" if settings.api_explorer else None,
        redoc_url=None,
    )
    # A trailing-slash redirect would be built from the caller's Host header.
    app.router.redirect_slashes = False
    app.state.runtime = runtime
    install_error_handlers(app)
    for module in (auth, admin, resharding, retention, members, monitoring, dead_letters,
                   performance, grafana, autoscaling):  # fmt: skip
        app.include_router(module.router)
    mount_console(app)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        await authorize(request)  # READ: its labels name streams and groups
        return Response(generate_latest(runtime.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    async def healthz(request: Request) -> JSONResponse:
        # Unauthenticated probe for load balancers: 503 once terminating, so
        # traffic moves away while in-flight work finishes.
        if runtime.gate.terminating:
            return JSONResponse({"status": "TERMINATING"}, status_code=503)
        if runtime.gate.suspended is not None:
            # Another live coordinator runs with other timings (see timings.py).
            return JSONResponse(
                {"status": "SUSPENDED", "reason": runtime.gate.suspended}, status_code=503
            )
        # The pid lets a supervisor (and the test launcher) tell its own process
        # from another one that happens to answer on the port.
        return JSONResponse(
            {"status": "UP", "coordinatorId": runtime.coordinator_id, "pid": os.getpid()}
        )

    @app.get("/livez", include_in_schema=False)
    async def livez() -> Response:
        # Unauthenticated liveness for orchestrators: the process answers.
        return Response(status_code=204)

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        # Unauthenticated readiness, no details (getCoordinatorHealth has the reasons).
        # ==, not `is`: the answer model holds the status as its wire string.
        down = (await runtime.health()).status == HealthStatus.DOWN
        gate = runtime.gate
        ready = not gate.terminating and gate.suspended is None and not down
        return Response(status_code=204 if ready else 503)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {})
            components["securitySchemes"] = {
                "basicAuth": {"type": "http", "scheme": "basic"},
                "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "HMAC-SHA256"},
            }
            schema["security"] = [{"bearerAuth": []}, {"basicAuth": []}]
            _declare_400_not_422(schema)
            add_links(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
