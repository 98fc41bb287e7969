"""The app's entry: the coordinator's middlewares, then the heartbeat route or FastAPI.

Heartbeats are nearly every request a coordinator serves.  Sent through
FastAPI, each would pass its and Starlette's per-request layers (telemetry,
body limit, exception and exit-stack middlewares, the router, which tries
routes in order) before reaching its route's handler, for nothing it needs.
So the coordinator's own middlewares (``outer``: request id, metrics, audit,
same-origin, body deadline and limit) wrap the whole app instead of sitting
inside it, and under them the heartbeat route is tried first: a request it
matches goes to its ``handle`` (api/members.py), every other to FastAPI.
All of it through public interfaces: ASGI middlewares composed in order, a
route's ``matches`` and ``handle``, the app's exception handlers.  The route
is also in the router, for the OpenAPI document; the router never sees a
request it matches.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CoordinatorApp"]


class CoordinatorApp(FastAPI):
    """FastAPI behind ``outer`` middlewares, with ``first`` tried before the router."""

    def __init__(self, *, outer: list[Middleware], first: BaseRoute, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outer = outer  # outermost first, as ``Starlette(middleware=...)`` takes them
        self.first = first
        self._entry: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: FastAPI's own
            await super().__call__(scope, receive, send)
            return
        entry = self._entry
        if entry is None:  # built at the first request, as Starlette builds its stack
            entry = self._entry = self._build_entry()
        scope["app"] = self  # what Starlette.__call__ sets (exception handlers, state)
        await entry(scope, receive, send)

    def _build_entry(self) -> ASGIApp:
        app: ASGIApp = _First(self.first, super().__call__)
        for cls, args, kwargs in reversed(self.outer):
            app = cls(app, *args, **kwargs)
        # The 500 of an error nothing else answered, with the app's own handler,
        # around everything (Starlette puts one around its stack likewise).
        handler = self.exception_handlers.get(500) or self.exception_handlers.get(Exception)
        return ServerErrorMiddleware(app, handler=handler, debug=self.debug)


class _First:
    """``route``'s requests to its ``handle``, every other request to ``app``."""

    def __init__(self, route: BaseRoute, app: ASGIApp) -> None:
        self.route = route
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A partial match (another method) is the route's too: it answers 405
        # as the router would have had it do.
        match, child_scope = self.route.matches(scope)
        if match is Match.NONE:
            await self.app(scope, receive, send)
            return
        scope.update(child_scope)  # what the router does on a match
        await self.route.handle(scope, receive, send)
