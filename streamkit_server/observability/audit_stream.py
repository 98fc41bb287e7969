"""Copies audit records to a capped Redis stream, off the request path.

The audit middleware hands each JSON line to ``submit`` (never awaits); one
background task writes them with ``XADD ... MAXLEN ~ n`` in pipelined
batches.  A Redis error or a full queue drops the copy, counts it in
``redis_stream_coord_audit_stream_failure_total`` and logs a warning at most
once per failure burst: the log line of the record has been written already,
and a request must never fail or wait because its audit copy could not be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from prometheus_client import Counter
from redis.exceptions import RedisError

from streamkit_server.store.records import RedisClient

__all__ = ["AuditStream"]

log = logging.getLogger("streamkit_server.audit")

_QUEUE_SIZE: Final = 4096
_BATCH: Final = 256
_WRITE_TIMEOUT_S: Final = 2.0


class AuditStream:
    def __init__(
        self,
        client: RedisClient,
        key: str,
        maxlen: int,
        failures: Counter,
        coordinator_id: str,
    ) -> None:
        self.key = key
        self._client = client
        self._maxlen = maxlen
        self._failures = failures
        self._coordinator_id = coordinator_id
        self._queue: asyncio.Queue[str] = asyncio.Queue(_QUEUE_SIZE)
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    def submit(self, line: str) -> None:
        """Queue one record; never blocks (a full queue drops and counts it)."""
        try:
            self._queue.put_nowait(line)
        except asyncio.QueueFull:
            self._failures.labels("queue_full").inc()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="streamkit-audit-stream")

    async def stop(self, flush_s: float = 1.0) -> None:
        """Write what is queued (for at most ``flush_s``), then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), flush_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < _BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: list[str]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for line in batch:
            pipe.xadd(
                self.key,
                {"record": line, "coordinatorId": self._coordinator_id},
                maxlen=self._maxlen,
                approximate=True,
            )
        try:
            # raise_on_error: every entry's reply is checked (a WRONGTYPE key
            # fails them all the same way).
            await asyncio.wait_for(pipe.execute(), _WRITE_TIMEOUT_S)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failures.labels("redis_error").inc(len(batch))
            if not self._failing:
                log.warning(
                    "audit records not copied to the Redis stream %r: %s (counted in "
                    "redis_stream_coord_audit_stream_failure_total; the log has them)",
                    self.key,
                    type(exc).__name__,
                )
            self._failing = True
            return
        if self._failing:
            log.info("audit records reach the Redis stream %r again", self.key)
        self._failing = False
