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
import time
from dataclasses import dataclass
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


# KEYS[1] counter; ARGV: window ms, cost (>= 0).  Adds cost, returns
# {count, remaining ms of the window}: a process's batch of counted events.
_ADD: Final = """
local count = redis.call('INCRBY', KEYS[1], ARGV[2])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {count, ttl}
"""

#: How late a process adds its events to a batched (``check_batched``) counter.
FLUSH_INTERVAL_MS: Final = 50


@dataclass(slots=True)
class _Share:
    """This process's view of one batched counter."""

    known: int  # the fleet's count at the last flush (this process's included)
    pending: int  # counted here since, not yet added in Redis
    window_end_ms: float  # local monotonic clock
    flush_due_ms: float
    flushing: bool = False


class RateLimited(CoordinatorError):
    """Over a limit: ``TOO_MANY_REQUESTS``, answered 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__("TOO_MANY_REQUESTS", message)
        self.retry_after_s = retry_after_s


class RateLimiter:
    def __init__(self, client: RedisClient, key_prefix: str) -> None:
        self._script: AsyncScript = client.register_script(_WINDOW)
        self._add: AsyncScript = client.register_script(_ADD)
        self._prefix = f"{key_prefix}:ratelimit"
        self._shares: dict[str, _Share] = {}

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

    async def check_batched(self, kind: str, ident: str, *, window_ms: int, limit: int) -> None:
        """Count one event against a limit shared by the fleet, without a round trip each.

        For the hottest path (heartbeats): the decision uses the fleet's count
        as of this process's last flush plus what this process counted since;
        the request that finds a flush due (every ``FLUSH_INTERVAL_MS``) adds
        this process's events to the shared counter and learns the fleet's
        count. One process limits exactly; a fleet of N processes can admit
        up to what the other N - 1 admit in one flush interval beyond the
        limit, which is what a guard against runaway clients can allow.
        """
        if limit <= 0:
            return
        key = f"{self._prefix}:{kind}:{ident}"
        now = time.monotonic() * 1000
        share = self._shares.get(key)
        if share is None or now >= share.window_end_ms:
            if len(self._shares) > 10_000:  # windows ended long ago: drop them
                self._shares = {k: v for k, v in self._shares.items() if v.window_end_ms > now}
            share = self._shares[key] = _Share(0, 0, now + window_ms, now)
        if now >= share.flush_due_ms and not share.flushing:
            # Add this process's events and learn the fleet's count before
            # deciding (the first event of a window learns it too).
            await self._flush(key, share, window_ms, now)
        if share.known + share.pending >= limit:
            seconds = max(1, -(-int(share.window_end_ms - now) // 1000))
            raise RateLimited(f"too many {kind} requests; retry in {seconds} s", seconds)
        share.pending += 1

    async def _flush(self, key: str, share: _Share, window_ms: int, now: float) -> None:
        share.flushing = True
        share.flush_due_ms = now + FLUSH_INTERVAL_MS
        added = share.pending
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                count, ttl = await self._add(keys=[key], args=[window_ms, added])
        except (RedisError, OSError, TimeoutError) as exc:
            # Fail open, as ``check`` does; the events stay counted here and
            # go with the next flush.
            log.warning("rate limit %s not shared: %s", key, type(exc).__name__)
            return
        finally:
            share.flushing = False
        share.pending -= added
        share.known = int(count)
        share.window_end_ms = time.monotonic() * 1000 + int(ttl)
