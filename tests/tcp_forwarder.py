"""A loopback TCP forwarder in front of a real Redis, for tests that cut or
hold the path: bytes go through unchanged unless a subclass says otherwise."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from streamkit.testing import HOST


class TcpForwarder:
    """Forwards every connection to ``upstream_port``.  Subclasses decide
    whether a new connection gets through (``admits``) and may hold back what
    a client sends (``to_upstream``)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def listen(self, port: int = 0) -> int:
        """Accept connections on ``port`` (0: any free one); returns the port."""
        self._server = await asyncio.start_server(self._serve, HOST, port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop_listening(self, *, wait: bool) -> None:
        if self._server is not None:
            self._server.close()
            if wait:
                await self._server.wait_closed()
            self._server = None

    def drop_connections(self) -> None:
        for writer in list(self._writers):
            writer.close()

    def admits(self) -> bool:
        return True

    async def to_upstream(self, data: bytes) -> bool:
        """Called with each chunk a client sends, before it goes on; False
        ends the connection instead."""
        return True

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(HOST, self.upstream_port)
        if not self.admits():
            client_w.close()
            upstream_w.close()
            return
        self._writers.update((client_w, upstream_w))

        async def up() -> None:
            while data := await client_r.read(65536):
                if not await self.to_upstream(data):
                    return
                upstream_w.write(data)
                await upstream_w.drain()

        async def down() -> None:
            while data := await upstream_r.read(65536):
                client_w.write(data)
                await client_w.drain()

        async def quietly(pipe: Callable[[], Awaitable[None]]) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                await pipe()

        tasks = [asyncio.create_task(quietly(up)), asyncio.create_task(quietly(down))]
        try:
            # Either side closing ends the connection.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_w, upstream_w):
                writer.close()
                self._writers.discard(writer)
