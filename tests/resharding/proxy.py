"""A TCP proxy in front of a real Redis that can hold back chosen commands.

Used to stop a coordinator at an exact point (here: after it recorded a
PREPARING migration, before it touched the new shard streams) so the test can
kill it there.  Bytes are forwarded unchanged; a client chunk that contains a
marker waits until ``release()`` (and is dropped if the proxy closes first).
"""

from __future__ import annotations

import asyncio

from tcp_forwarder import TcpForwarder


class HoldingProxy(TcpForwarder):
    def __init__(self, upstream_port: int, markers: tuple[bytes, ...]) -> None:
        super().__init__(upstream_port)
        self.markers = markers
        #: Set once a chunk was held back.
        self.holding = asyncio.Event()
        self._released = asyncio.Event()
        self._closing = False

    async def start(self) -> int:
        return await self.listen()

    def release(self) -> None:
        self._released.set()

    async def close(self) -> None:
        self._closing = True
        self._released.set()
        await self.stop_listening(wait=False)
        self.drop_connections()

    async def to_upstream(self, data: bytes) -> bool:
        if any(marker in data for marker in self.markers):
            self.holding.set()
            await self._released.wait()
            return not self._closing
        return True
