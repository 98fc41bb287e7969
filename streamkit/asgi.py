"""Run a :class:`~streamkit.app.StreamKit` app inside an ASGI app (FastAPI, Starlette).

``streamkit_lifespan(app)`` is a lifespan: the web server's start serves the
app's listeners in the same event loop (and starts its publishers), its
shutdown drains and leaves as ``streamkit run`` does on SIGTERM.  Route
handlers publish with the app's publishers (``app.publisher(...)``); they are
also on ``web_app.state.streamkit``::

    sk = StreamKit()
    orders = sk.publisher(stream_prefix="orders", group="billing")
    web = FastAPI(lifespan=streamkit_lifespan(sk))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from streamkit.app import StreamKit
from streamkit.observability.probes import ready

__all__ = ["streamkit_lifespan"]


def streamkit_lifespan(
    app: StreamKit, *, ready_within: float = 30.0
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A lifespan serving ``app`` while the web app runs.

    Start-up waits (up to ``ready_within`` seconds) until the listeners'
    members have joined, so the first request finds them consuming; it fails
    if ``serve()`` does (an unknown group, an unreachable coordinator).
    """

    @asynccontextmanager
    async def lifespan(web_app: Any) -> AsyncIterator[None]:
        state = getattr(web_app, "state", None)
        if state is not None:
            state.streamkit = app
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.serve)
            with anyio.fail_after(ready_within):
                # Polled: readiness is member state without an event to wait on.
                while not ready(app)[0]:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            try:
                yield
            finally:
                app.shutdown()

    return lifespan
