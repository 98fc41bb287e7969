"""The operator console: static files under ``/console/`` plus its settings.

The page is plain HTML, CSS and JavaScript shipped in the package
(``streamkit_server/console/``): no build step, nothing fetched from a CDN.
It talks to the same ``/coord/v1`` API as every other client, with a bearer
token from ``loginCoordinatorApi``.  Its routes stay out of the OpenAPI
document, like ``/metrics`` and ``/healthz``: they are not part of the
contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from streamkit_server.api.deps import check_role, runtime
from streamkit_server.auth.security import Principal, Role

__all__ = ["CONSOLE_DIR", "CONSOLE_PATH", "mount_console"]

CONSOLE_PATH = "/console"
CONSOLE_DIR = Path(__file__).resolve().parents[1] / "console"

# Everything the page loads comes from this origin: a copy of the page cannot
# be made to pull scripts from elsewhere, and it cannot be framed.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page changes with the package version; a stale cached script
    # talking to a newer server helps nobody.
    "Cache-Control": "no-cache",
}


class _ConsoleFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_HEADERS)
        return response


router = APIRouter(include_in_schema=False)


async def _reader(request: Request) -> Principal:
    # Not an API route: outside the role matrix, so checked here.
    return await check_role(request, Role.READ)


@router.get(CONSOLE_PATH)
async def console_root() -> RedirectResponse:
    # Relative URLs in index.html resolve against the directory.
    return RedirectResponse(f"{CONSOLE_PATH}/", status_code=308)


@router.get(f"{CONSOLE_PATH}/settings.json")
async def console_settings(
    request: Request, _p: Annotated[Principal, Depends(_reader)]
) -> JSONResponse:
    """The timings the page needs to show leases (e.g. a member's remaining lease)."""
    settings = runtime(request).settings
    return JSONResponse(
        {
            "heartbeatIntervalMs": settings.heartbeat_interval_ms,
            "memberLeaseTtlMs": settings.member_lease_ttl_ms,
            "rebalanceTimeoutMs": settings.rebalance_timeout_ms,
            "producerRoutingLeaseMs": settings.producer_routing_lease_ms,
            "tickIntervalMs": settings.tick_interval_ms,
        },
        headers={"Cache-Control": "no-store"},
    )


def mount_console(app: FastAPI) -> None:
    """Serve the console; call after the API routers (the mount matches a prefix)."""
    app.include_router(router)
    app.mount(CONSOLE_PATH, _ConsoleFiles(directory=CONSOLE_DIR, html=True), name="console")
