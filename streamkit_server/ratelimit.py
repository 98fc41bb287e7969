"""Rate limits shared by every coordinator process on one Redis.

One small Lua script implements a fixed-window counter per key: it adds
``cost`` (0 only reads) and answers how many milliseconds remain in the
window when the count is above the limit, or -1.  Windows and limits come
from settings; the defaults are far above what a healthy fleet sends (see
docs/operations.md#rate-limits), so they only bite on brute force and
runaway loops.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from streamkit_server.errors import CoordinatorError
from streamkit_server.store import RedisClient

__all__ = ["RateLimited", "RateLimiter"]

log = logging.getLogger("streamkit_server.ratelimit")
_TIMEOUT_S: Final = 0.5

# KEYS[1] counter; ARGV: window ms, limit, cost.  Returns the window's
# remaining ms once the count exceeds the limit, else -1.
_WINDOW: Final = """
local cost = tonumber(ARGV[3])
local count
if cost > 0 then
  count = redis.call('INCRBY', KEYS[1], cost)
  if count == cost then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
else
  count = tonumber(redis.call('GET', KEYS[1]) or '0')
end
if count > tonumber(ARGV[2]) then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
  return ttl
end
return -1
"""


class RateLimited(CoordinatorError):
    """Over a limit: ``TOO_MANY_REQUESTS``, answered 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__("TOO_MANY_REQUESTS", message)
        self.retry_after_s = retry_after_s


class RateLimiter:
    def __init__(self, client: RedisClient, key_prefix: str) -> None:
        self._script: AsyncScript = client.register_script(_WINDOW)
        self._prefix = f"{key_prefix}:ratelimit"

    async def _remaining_ms(
        self, kind: str, ident: str, window_ms: int, limit: int, cost: int
    ) -> int:
        key = f"{self._prefix}:{kind}:{ident}"
        return int(await self._script(keys=[key], args=[window_ms, limit, cost]))

    async def check(
        self, kind: str, ident: str, *, window_ms: int, limit: int, cost: int = 1
    ) -> None:
        """Count one event (``cost`` 0: only look); 429 when ``ident`` is over ``limit``."""
        if limit <= 0:  # 0 turns a limit off
            return
        key = f"{self._prefix}:{kind}:{ident}"
        try:
            # asyncio.timeout, not wait_for: no task per check (wait_for makes
            # one on Python 3.11, and every authenticated request checks).
            async with asyncio.timeout(_TIMEOUT_S):
                remaining = int(await self._script(keys=[key], args=[window_ms, limit, cost]))
        except (RedisError, OSError, TimeoutError) as exc:
            # Fail open: a limiter key on a slow or unreachable node (Redis
            # Cluster) must not make every request wait or fail; the request
            # itself still needs its own keys.
            log.warning("rate limit %s not checked: %s", kind, type(exc).__name__)
            return
        if remaining >= 0:
            seconds = max(1, -(-remaining // 1000))
            raise RateLimited(f"too many {kind} requests; retry in {seconds} s", seconds)
