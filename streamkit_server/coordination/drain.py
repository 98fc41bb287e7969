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
from streamkit_server.store.records import RedisClient

__all__ = ["DrainProber", "DrainResult"]

# KEYS: one shard stream.  ARGV: 'probe' or 'retire', then the names of the
# coordinator's groups of the stream.
_DRAIN = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return 1 end
if t ~= 'stream' then
  return redis.error_reply('WRONGTYPE shard key ' .. KEYS[1] .. ' holds a ' .. t)
end
local seen = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  -- A nil lag arrives as false: unknown is not zero.
  if f['pending'] ~= 0 or f['lag'] ~= 0 then return 0 end
  seen[f['name']] = true
end
-- A coordinator group whose Redis group is gone from a non-empty key never
-- read these entries; deleting the key would lose them for it.
if redis.call('XLEN', KEYS[1]) > 0 then
  for i = 2, #ARGV do
    if not seen[ARGV[i]] then return -1 end
  end
end
if ARGV[1] == 'retire' then redis.call('UNLINK', KEYS[1]) end
return 1
"""


class DrainResult(IntEnum):
    DRAINED = 1
    BACKLOG = 0  # pending entries, lag above zero, or lag unknown
    GROUP_MISSING = -1  # a coordinator group has no Redis group on a non-empty key


class DrainProber:
    def __init__(self, client: RedisClient) -> None:
        self._script: AsyncScript = client.register_script(_DRAIN)

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
