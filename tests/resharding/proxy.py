"""A TCP proxy in front of a real Redis that can hold back chosen commands.

Used to stop a coordinator at an exact point (here: after it recorded a
PREPARING migration, before it touched the new shard streams) so the test can
kill it there.  Bytes are forwarded unchanged; a client chunk that contains a
marker waits until ``release()`` (and is dropped if the proxy closes first).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from streamkit.testing import HOST


class HoldingProxy:
    def __init__(self, upstream_port: int, markers: tuple[bytes, ...]) -> None:
        self.upstream_port = upstream_port
        self.markers = markers
        #: Set once a chunk was held back.
        self.holding = asyncio.Event()
        self._released = asyncio.Event()
        self._closing = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def release(self) -> None:
        self._released.set()

    async def close(self) -> None:
        self._closing = True
        self._released.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(HOST, self.upstream_port)
        self._writers.update((client_w, upstream_w))

        async def to_redis() -> None:
            while data := await client_r.read(65536):
                if any(marker in data for marker in self.markers):
                    self.holding.set()
                    await self._released.wait()
                    if self._closing:
                        return
                upstream_w.write(data)
                await upstream_w.drain()

        async def to_client() -> None:
            while data := await upstream_r.read(65536):
                client_w.write(data)
                await client_w.drain()

        async def quietly(pipe: Callable[[], Awaitable[None]]) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                await pipe()

        tasks = [asyncio.create_task(quietly(to_redis)), asyncio.create_task(quietly(to_client))]
        try:
            # Either side closing ends the connection.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_w, upstream_w):
                writer.close()
                self._writers.discard(writer)
