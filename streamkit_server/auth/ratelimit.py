"""Rate limits shared by every coordinator process on one Redis.

One small Lua script implements a fixed-window counter per key: it adds
``cost`` (0 only reads) and answers how many milliseconds remain in the
window when the count is above the limit, or -1.  Heartbeats, the hottest
path, are counted in this process and shared in batches (``check_batched``).
Windows and limits come from settings; the defaults are far above what a healthy fleet sends (see
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
from streamkit_server.store import scripts
from streamkit_server.store.keys import ratelimit_prefix
from streamkit_server.store.records import RedisClient

__all__ = ["RateLimited", "RateLimiter"]

log = logging.getLogger("streamkit_server.ratelimit")
_TIMEOUT_S: Final = 0.5


#: The least time between two flushes of the batched (``check_batched``)
#: counters; one flush carries every counter due, in one pipeline.
FLUSH_INTERVAL_MS: Final = 50
#: A counter far from its limit is shared at least this often.
SHARE_INTERVAL_MS: Final = 1_000
#: A counter is due sooner once its unshared events reach 1/_HEADROOM_SHARE
#: of what its limit has left: the closer to the limit, the more often.
_HEADROOM_SHARE: Final = 8


@dataclass(slots=True)
class _Share:
    """This process's view of one batched counter."""

    limit: int
    window_ms: int
    window_end_ms: float  # local monotonic clock
    known: int = 0  # the fleet's count at the last flush (this process's included)
    pending: int = 0  # counted here since, not yet added in Redis
    sending: int = 0  # of ``pending``, what a flush still out is adding
    shared_ms: float = 0.0  # when a flush last took this counter

    def due(self, now: float) -> bool:
        unsent = self.pending - self.sending
        if unsent <= 0:
            return False
        headroom = self.limit - self.known - self.pending
        return unsent * _HEADROOM_SHARE >= headroom or now - self.shared_ms >= SHARE_INTERVAL_MS


class RateLimited(CoordinatorError):
    """Over a limit: ``TOO_MANY_REQUESTS``, answered 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__("TOO_MANY_REQUESTS", message)
        self.retry_after_s = retry_after_s


class RateLimiter:
    def __init__(self, client: RedisClient, key_prefix: str) -> None:
        self._client = client
        self._script: AsyncScript = client.register_script(scripts.RATE_WINDOW)
        self._prefix = ratelimit_prefix(key_prefix)
        self._shares: dict[str, _Share] = {}
        self._flushed_ms = -float(SHARE_INTERVAL_MS)  # when the last flush started
        self._flushing = False

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

    async def peek(self, kind: str, ident: str) -> int:
        """The count of ``ident``'s current window (0 when Redis does not answer)."""
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                raw = await self._client.get(f"{self._prefix}:{kind}:{ident}")
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("rate limit %s not read: %s", kind, type(exc).__name__)
            return 0
        return int(raw or 0)

    async def check_batched(self, kind: str, ident: str, *, window_ms: int, limit: int) -> None:
        """Count one event against a limit shared by the fleet, without a round trip each.

        For the hottest path (heartbeats): the decision uses the fleet's count
        as of this process's last flush plus what this process counted since.
        The first event of a window learns the fleet's count before deciding.
        After that a counter is shared when its unshared events reach an
        eighth of what the limit has left, and at least every
        ``SHARE_INTERVAL_MS``; one flush (at most every ``FLUSH_INTERVAL_MS``)
        carries every counter due, in one pipeline.  A coordinator serving
        many healthy groups, far below their limits, so pays about one round
        trip per second, not one per heartbeat.  One process limits exactly;
        a fleet of N processes can admit beyond the limit what the other
        N - 1 have not shared yet, at most an eighth of the headroom each:
        what a guard against runaway clients can allow.
        """
        if limit <= 0:
            return
        key = f"{self._prefix}:{kind}:{ident}"
        now = time.monotonic() * 1000
        share = self._shares.get(key)
        if share is None or now >= share.window_end_ms:
            if len(self._shares) > 10_000:  # windows ended long ago: drop them
                self._shares = {k: v for k, v in self._shares.items() if v.window_end_ms > now}
            share = self._shares[key] = _Share(limit, window_ms, now + window_ms)
            # Learn the fleet's count of this window first, even while another
            # flush is out (that one does not carry this counter).
            await self._flush(now, share)
        elif (
            now - self._flushed_ms >= FLUSH_INTERVAL_MS
            and not self._flushing
            and (share.due(now) or now - self._flushed_ms >= SHARE_INTERVAL_MS)
        ):
            # This counter is due, or others may be: quiet groups' events are
            # shared within about a second of any traffic.
            self._flushing = True
            try:
                await self._flush(now)
            finally:
                self._flushing = False
        if share.known + share.pending >= limit:
            seconds = max(1, -(-int(share.window_end_ms - now) // 1000))
            raise RateLimited(f"too many {kind} requests; retry in {seconds} s", seconds)
        share.pending += 1

    async def _flush(self, now: float, new: _Share | None = None) -> None:
        """Add the due counters' events in Redis (and ``new``'s 0); learn their counts."""
        self._flushed_ms = now
        batch = [(k, v, v.pending - v.sending) for k, v in self._shares.items()
                 if v is new or v.due(now)]  # fmt: skip
        pipe = self._client.pipeline(transaction=False)
        for key, share, added in batch:
            # Another flush may still be adding earlier events: only the rest.
            share.sending += added
            share.shared_ms = now
            # Plain commands, no script: a cluster pipeline splits them by node.
            pipe.incrby(key, added)
            pipe.pexpire(key, share.window_ms, nx=True)  # a new window's first add
            pipe.pttl(key)
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError, TimeoutError) as exc:
            # Fail open, as ``check`` does; the events stay counted here and
            # go with a later flush.
            log.warning("rate limits not shared: %s", type(exc).__name__)
            replies = [exc] * (3 * len(batch))
        finally:
            for _key, share, added in batch:
                share.sending -= added
        done = time.monotonic() * 1000
        failed = 0
        for i, (_key, share, added) in enumerate(batch):
            count, _, ttl = replies[3 * i : 3 * i + 3]
            if isinstance(count, BaseException) or isinstance(ttl, BaseException):
                failed += 1  # Redis (or one cluster node) down: still pending
                continue
            share.pending -= added
            share.known = int(count)
            # -1/-2: the key lost its expiry or expired in between; a new window.
            ttl_ms = int(ttl) if int(ttl) > 0 else share.window_ms
            share.window_end_ms = done + ttl_ms
        if failed and failed < len(batch):
            log.warning("%d of %d rate limits not shared", failed, len(batch))
