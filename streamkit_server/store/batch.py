"""Group commit for the steady-write script: concurrent calls share one round trip.

A steady heartbeat's only Redis command is the steady-write script, and on
this kind of host a round trip costs the coordinator more CPU (two system
calls and an event-loop wake-up) than the script's own work.  When a process
is busy, heartbeats of *different* groups are ready together; sending them
as one pipeline pays the round trip once.

The rule is a group commit, as the publisher's (``streamkit/publisher/coalescer.py``):
a caller that finds fewer than ``max_in_flight`` (2) calls out sends its own
at once, exactly as without batching, so a lone heartbeat waits for nothing.
Calls that arrive while that many are out queue up, and go together, as one
pipeline, as soon as one of them returns.  Two rather than one: a single
outstanding call makes every queued heartbeat wait out a full round trip
first, which costs latency when a few connections are busy and most of the
saving comes from the larger batches of a busy process anyway.  Each call
still gets its own reply or its own error: the pipeline is not a
transaction, and the scripts are independent (each touches one group's
keys, and a process has at most one write of a group out at a time).  A
connection error fails every call of its pipeline, as it would have failed
each of them alone.

Redis Cluster clients call the script directly (a pipeline there spans
nodes; not worth its bookkeeping for this).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from prometheus_client import Histogram
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

__all__ = ["ScriptBatcher"]

_Call = tuple[Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]


class ScriptBatcher:
    def __init__(
        self,
        client: Redis | RedisCluster,
        script: AsyncScript,
        sizes: Histogram | None = None,
        *,
        max_in_flight: int = 2,
    ) -> None:
        self._client = client if isinstance(client, Redis) else None
        self._script = script
        self._sizes = sizes  # observes each shared pipeline's count of calls
        self._max_in_flight = max_in_flight
        self._in_flight = 0  # calls and pipelines sent, not yet answered
        # Calls waiting for one of those to return.  Invariant: empty
        # whenever fewer than ``max_in_flight`` are out.
        self._queue: list[_Call] = []
        #: Calls sent in a shared pipeline, and those pipelines.
        self.batched_calls = 0
        self.batches = 0

    async def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self._client is None:
            return await self._script(keys=keys, args=args)
        if self._in_flight >= self._max_in_flight:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._queue.append((keys, args, future))
            return await future
        self._in_flight += 1
        try:
            return await self._script(keys=keys, args=args)
        finally:
            self._in_flight -= 1
            self._hand_over()

    def _hand_over(self) -> None:
        """After an answer: send what queued meanwhile, all of it as one pipeline."""
        if self._queue and self._in_flight < self._max_in_flight:
            self._in_flight += 1
            batch, self._queue = self._queue, []
            asyncio.get_running_loop().create_task(self._send_queued(batch))

    async def _send_queued(self, batch: list[_Call]) -> None:
        try:
            await self._send(batch)
        finally:
            self._in_flight -= 1
            self._hand_over()

    async def _send(self, batch: list[_Call]) -> None:
        assert self._client is not None
        live = [call for call in batch if not call[2].done()]  # a waiter gone by now
        if not live:
            return
        self.batches += 1
        self.batched_calls += len(live)
        if self._sizes is not None:
            self._sizes.observe(len(live))
        pipe = self._client.pipeline(transaction=False)
        sha = self._script.sha
        for keys, args, _ in live:
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            for _, _, future in live:
                if future.done():
                    continue
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:  # cancelled (the process stops): so are its waiters
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
            return
        for (keys, args, future), reply in zip(live, replies, strict=True):
            if isinstance(reply, NoScriptError):
                # Redis lost its script cache (a restart, SCRIPT FLUSH): the
                # script object loads it again and runs this call alone.
                try:
                    reply = await self._script(keys=keys, args=args)
                except Exception as exc:
                    reply = exc
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
