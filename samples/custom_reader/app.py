"""Custom reader sample: the coordinator assigns shards, this code reads them.

``app.shard_listener`` runs coordinator members without the built-in poller.
The ``ShardLifecycle`` below starts one read loop per assigned shard, claims
what the previous owner left pending before reading new entries, checks
``ctx.may_read`` before every read (it turns false on revoke, fencing and
lease expiry), bounds each blocking read by the remaining lease, and returns
from ``on_revoked`` only once its loops have stopped, so the shard is
reported ``REVOKED`` with nothing in flight.

Run it, with the coordinator's credentials (heartbeats need them)::

    STREAMKIT_COORDINATOR_USERNAME=admin STREAMKIT_COORDINATOR_PASSWORD=... \
        streamkit run samples.custom_reader.app:app
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio

from streamkit import ShardContext, StreamKit

AUDIT = "audit"
AUDITOR = "auditor"
#: Redis hash: shard -> entries this sample processed (to observe it work).
COUNTS = "samples:audit:counts"

log = logging.getLogger("samples.custom_reader")


@dataclass
class _ReadLoop:
    stopped: anyio.Event = field(default_factory=anyio.Event)
    #: Set when the member lost the shard: stop without acknowledging anything.
    abandoned: bool = False


class AuditReader:
    def __init__(self, batch: int = 100, block_ms: int = 1_000) -> None:
        self.batch = batch
        self.block_ms = block_ms
        self._loops: dict[tuple[str, int], _ReadLoop] = {}

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        for shard in shards:
            previous = self._loops.get((ctx.member_id, shard))
            if previous is not None:
                previous.abandoned = True  # a loop from before a loss: retire it
            loop = self._loops[(ctx.member_id, shard)] = _ReadLoop()
            ctx.start_soon(self._read_shard, shard, ctx, loop)

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        # Return only once the loops stopped: everything they read is acked.
        for shard in shards:
            loop = self._loops.pop((ctx.member_id, shard), None)
            if loop is not None:
                await loop.stopped.wait()

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        # Another member may own these shards already: stop touching them,
        # including entries read a moment ago (they stay pending for the owner).
        for shard in shards:
            loop = self._loops.pop((ctx.member_id, shard), None)
            if loop is not None:
                loop.abandoned = True
        log.warning("%s lost shards %s", ctx.member_id, sorted(shards))

    async def _read_shard(self, shard: int, ctx: ShardContext, loop: _ReadLoop) -> None:
        key = ctx.stream_key(shard)
        start: str | bytes | None = "0-0"  # first what a previous owner left pending
        try:
            while not loop.abandoned and shard in ctx.owned_shards:
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
                if entries and not loop.abandoned:
                    await self._process(ctx, shard, key, [entry_id for entry_id, _ in entries])
        finally:
            loop.stopped.set()

    async def _process(self, ctx: ShardContext, shard: int, key: str, ids: list[bytes]) -> None:
        await ctx.redis.hincrby(COUNTS, str(shard), len(ids))
        await ctx.redis.xack(key, ctx.consumer_group, *ids)


app = StreamKit()
app.shard_listener(stream_prefix=AUDIT, group=AUDITOR, lifecycle=AuditReader(), concurrency=2)
