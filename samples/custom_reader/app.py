"""Custom reader sample: the coordinator assigns shards, this code reads them.

``app.shard_listener`` runs coordinator members without the built-in poller.
The ``ShardLifecycle`` below starts one read loop per assigned shard, claims
what the previous owner left pending before reading new entries, checks
``ctx.may_read`` before every read (it turns false on revoke, fencing and
lease expiry), bounds each blocking read by the remaining lease, and returns
from ``on_revoked`` only once its loops have stopped, so the shard is
reported ``REVOKED`` with nothing in flight.

Run it::

    streamkit run samples.custom_reader.app:app
"""

from __future__ import annotations

import logging

import anyio

from streamkit import ShardContext, StreamKit

AUDIT = "audit"
AUDITOR = "auditor"
#: Redis hash: shard -> entries this sample processed (to observe it work).
COUNTS = "samples:audit:counts"

log = logging.getLogger("samples.custom_reader")


class AuditReader:
    def __init__(self, batch: int = 100, block_ms: int = 1_000) -> None:
        self.batch = batch
        self.block_ms = block_ms
        self._stopped: dict[tuple[str, int], anyio.Event] = {}

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        for shard in shards:
            stopped = self._stopped[(ctx.member_id, shard)] = anyio.Event()
            ctx.start_soon(self._read_shard, shard, ctx, stopped)

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        for shard in shards:
            stopped = self._stopped.pop((ctx.member_id, shard), None)
            if stopped is not None:
                await stopped.wait()

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        # Another member may own these shards already: the loops see
        # may_read() turn false and stop without acknowledging anything more.
        for shard in shards:
            self._stopped.pop((ctx.member_id, shard), None)
        log.warning("%s lost shards %s", ctx.member_id, sorted(shards))

    async def _read_shard(self, shard: int, ctx: ShardContext, stopped: anyio.Event) -> None:
        key = ctx.stream_key(shard)
        start = "0-0"  # first the entries a previous owner left pending
        try:
            while shard in ctx.owned_shards:
                block = min(self.block_ms, ctx.lease_remaining_ms() - 50)
                if not ctx.may_read(shard) or block < 10:
                    await anyio.sleep(0.05)  # lease lapsed: wait for a heartbeat
                    continue
                if start is not None:
                    start, entries, _deleted = await ctx.redis.xautoclaim(
                        key, ctx.consumer_group, ctx.consumer_name, 0, start, count=self.batch
                    )
                    if start in (b"0-0", "0-0"):
                        start = None
                else:
                    reply = await ctx.redis.xreadgroup(
                        ctx.consumer_group,
                        ctx.consumer_name,
                        {key: ">"},
                        count=self.batch,
                        block=block,
                    )
                    entries = reply[0][1] if reply else []
                if entries:
                    await self._process(ctx, shard, key, [entry_id for entry_id, _ in entries])
        finally:
            stopped.set()

    async def _process(self, ctx: ShardContext, shard: int, key: str, ids: list[bytes]) -> None:
        await ctx.redis.hincrby(COUNTS, str(shard), len(ids))
        await ctx.redis.xack(key, ctx.consumer_group, *ids)


app = StreamKit()
app.shard_listener(stream_prefix=AUDIT, group=AUDITOR, lifecycle=AuditReader(), concurrency=2)
