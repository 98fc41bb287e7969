"""A loopback TCP proxy whose upstream and answers the soak controls.

One class serves three roles:

* the coordinators' load balancer: several upstreams, tried in turn, and
  answers that can be delayed or dropped (the connection is cut after the
  request was forwarded, so the coordinator acted but the client never hears);
* the Redis endpoint clients use: a failover switches it to the promoted
  replica and cuts every open connection, as a DNS or VIP flip does;
* the replication link between a primary and its replica: ``hold()`` keeps
  what the primary sends in this process, so the replica lags, and
  ``close()`` drops it: writes the primary acknowledged that no replica ever
  received.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

from streamkit.testing import HOST


class ChaosProxy:
    def __init__(self, upstreams: list[int], *, seed: int = 0) -> None:
        self.upstreams = list(upstreams)
        self.delay_s = 0.0
        self.drop_p = 0.0
        self.holding = False
        self.dropped = 0
        self._rng = random.Random(seed)
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def switch(self, upstreams: list[int], *, cut: bool) -> None:
        """New connections go to ``upstreams``; ``cut`` closes the open ones."""
        self.upstreams = list(upstreams)
        if cut:
            self.cut()

    def cut(self) -> None:
        for client_w, upstream_w in list(self._conns):
            client_w.close()
            upstream_w.close()
        self._conns.clear()

    def hold(self) -> None:
        self.holding = True

    def release(self) -> None:
        self.holding = False
        held, self._held = self._held, []
        for writer, data in held:
            if not writer.is_closing():
                writer.write(data)

    async def close(self) -> None:
        """Stop serving; whatever was held is dropped."""
        self._held.clear()
        if self._server is not None:
            self._server.close()
        self.cut()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        ports = list(self.upstreams)
        if not ports:
            return None
        first = next(self._turn)
        for i in range(len(ports)):
            port = ports[(first + i) % len(ports)]
            with contextlib.suppress(OSError):
                return await asyncio.open_connection(HOST, port)
        return None

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            client_w.close()
            return
        upstream_r, upstream_w = upstream
        pair = (client_w, upstream_w)
        self._conns.add(pair)

        async def to_upstream() -> None:
            while data := await client_r.read(65536):
                upstream_w.write(data)
                await upstream_w.drain()

        async def to_client() -> None:
            while data := await upstream_r.read(65536):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.drop_p and self._rng.random() < self.drop_p:
                    # The request went through; its answer is lost.
                    self.dropped += 1
                    return
                if self.holding:
                    self._held.append((client_w, data))
                    continue
                client_w.write(data)
                await client_w.drain()

        async def quietly(pipe: asyncio.Future[None] | object) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                await pipe  # type: ignore[misc]

        tasks = [
            asyncio.ensure_future(quietly(to_upstream())),
            asyncio.ensure_future(quietly(to_client())),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            client_w.close()
            upstream_w.close()
            self._conns.discard(pair)
