"""The Redis-level drain proof of a shard stream, and its retirement.

A removed shard is drained when every consumer group on its key reports
``pending == 0`` and a known ``lag == 0`` (``XINFO GROUPS``; a nil lag, which
Redis reports when it cannot tell, is not a proof).  A key that no longer
exists is drained.  Retiring re-checks the proof and deletes the key in the
same Lua script, so an entry that arrived after the probe keeps the shard
alive: a stale probe can delay retirement but never lose data.

Both run as a one-key script (``XINFO`` is allowed in scripts on Redis 7.0),
which keeps them atomic and valid in Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from redis.commands.core import AsyncScript

from streamkit.routing import stream_key
from streamkit_server.store import scripts
from streamkit_server.store.records import RedisClient

__all__ = ["DrainProber", "DrainResult"]


class DrainResult(IntEnum):
    DRAINED = 1
    BACKLOG = 0  # pending entries, lag above zero, or lag unknown
    GROUP_MISSING = -1  # a coordinator group has no Redis group on a non-empty key


class DrainProber:
    def __init__(self, client: RedisClient) -> None:
        self._script: AsyncScript = client.register_script(scripts.DRAIN)

    async def probe(self, stream_prefix: str, shard: int, groups: Sequence[str]) -> DrainResult:
        return await self._run("probe", stream_prefix, shard, groups)

    async def retire(self, stream_prefix: str, shard: int, groups: Sequence[str]) -> DrainResult:
        """Delete the shard stream if (and only if) it is still drained."""
        return await self._run("retire", stream_prefix, shard, groups)

    async def _run(
        self, mode: str, stream_prefix: str, shard: int, groups: Sequence[str]
    ) -> DrainResult:
        reply = await self._script(keys=[stream_key(stream_prefix, shard)], args=[mode, *groups])
        return DrainResult(int(reply))
