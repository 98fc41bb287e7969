"""A frozen copy of the layout-v1 metadata store (the aggregate in one hash field).

It reads and writes exactly as a coordinator before layout v2 did (the Lua
below is that version's, unchanged), so tests can play the older coordinator
against a current one on the same Redis: a v1 group must be upgraded in place,
and a v1 coordinator must refuse a v2 group instead of overwriting it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from streamkit.testing import AsyncRedisClient

from ..sim import KEY_PREFIX

_LOAD = """
if ARGV[1] ~= '' then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
local m = redis.call('HMGET', KEYS[2], 'revision', 'schemaVersion', 'layoutVersion', 'updatedAt')
if not m[1] then
  if ARGV[1] ~= '' then redis.call('DEL', KEYS[1]) end
  return {2, redis.call('EXISTS', KEYS[2])}
end
local len = redis.call('HSTRLEN', KEYS[2], 'aggregate')
if m[1] == ARGV[3] and m[4] == ARGV[4] and tostring(len) == ARGV[5] then
  return {1, m[1], m[2], m[3], m[4], len}
end
return {1, m[1], m[2], m[3], m[4], len, redis.call('HGET', KEYS[2], 'aggregate')}
"""

_COMMIT = """
local cur = redis.call('HGET', KEYS[1], 'revision')
local ok
if ARGV[1] == '' then ok = redis.call('EXISTS', KEYS[1]) == 0 else ok = cur == ARGV[1] end
local new = ''
if ok then
  if ARGV[1] == '' then new = '1' else new = string.format('%d', tonumber(ARGV[1]) + 1) end
  redis.call('HSET', KEYS[1], 'aggregate', ARGV[2], 'revision', new,
    'schemaVersion', ARGV[3], 'layoutVersion', ARGV[4], 'updatedAt', ARGV[5])
end
if ARGV[6] ~= '' and redis.call('GET', KEYS[2]) == ARGV[6] then redis.call('DEL', KEYS[2]) end
if ok then return {1, new} end
return {0, cur}
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class V1Unsupported(Exception):
    """What the v1 store raised for metadata it does not understand."""


class V1Store:
    def __init__(self, client: AsyncRedisClient) -> None:
        self.client = client
        self._load = client.register_script(_LOAD)
        self._commit = client.register_script(_COMMIT)
        self._release = client.register_script(_RELEASE)

    @staticmethod
    def keys(prefix: str, group: str) -> tuple[str, str]:
        tag = f"{{{prefix}:{group}}}"
        return f"{KEY_PREFIX}:{tag}:metadata", f"{KEY_PREFIX}:{tag}:mutex"

    async def load(self, prefix: str, group: str, token: str) -> tuple[int, str] | None:
        """(revision, aggregate JSON) with the mutex held by ``token``, as v1 did."""
        metadata, mutex = self.keys(prefix, group)
        reply = await self._load(keys=[mutex, metadata], args=[token, 5000, "", "", ""])
        if int(reply[0]) == 2:
            return None
        assert int(reply[0]) == 1, reply
        schema, layout = reply[2], reply[3]
        if schema != "1" or layout != "1":
            await self._release(keys=[mutex], args=[token])
            raise V1Unsupported(
                f"group metadata {metadata} has schemaVersion={schema} layoutVersion={layout}; "
                "this coordinator understands only schemaVersion=1 layoutVersion=1"
            )
        return int(reply[1]), str(reply[6])

    async def commit(
        self, prefix: str, group: str, aggregate: str, expected: int | None, token: str
    ) -> bool:
        metadata, mutex = self.keys(prefix, group)
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        args = ["" if expected is None else str(expected), aggregate, "1", "1", stamp, token]
        reply = await self._commit(keys=[metadata, mutex], args=args)
        return int(reply[0]) == 1
