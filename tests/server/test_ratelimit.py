"""The batched limiter (heartbeats): exact for one process, shared across
processes through Redis every flush interval, fail-open when Redis fails."""

from __future__ import annotations

import uuid

import anyio
import pytest
import redis.asyncio

from streamkit.connections import connect_redis
from streamkit.testing import RedisServer
from streamkit_server.ratelimit import FLUSH_INTERVAL_MS, RateLimited, RateLimiter
from streamkit_server.store import RedisClient

pytestmark = pytest.mark.redis


async def admitted(limiter: RateLimiter, ident: str, events: int, limit: int) -> int:
    count = 0
    for _ in range(events):
        try:
            await limiter.check_batched("hb", ident, window_ms=10_000, limit=limit)
        except RateLimited as exc:
            assert 1 <= exc.retry_after_s <= 10
            continue
        count += 1
    return count


async def test_one_process_admits_exactly_the_limit(redis_server: RedisServer) -> None:
    client: RedisClient = connect_redis(redis_server.url)
    try:
        limiter = RateLimiter(client, f"t-{uuid.uuid4().hex[:6]}")
        assert await admitted(limiter, "g", 25, limit=10) == 10
        assert await admitted(limiter, "other", 3, limit=10) == 3  # per ident
    finally:
        await client.aclose()


async def test_processes_share_their_counts(redis_server: RedisServer) -> None:
    client: RedisClient = connect_redis(redis_server.url)
    try:
        prefix = f"t-{uuid.uuid4().hex[:6]}"
        a, b = RateLimiter(client, prefix), RateLimiter(client, prefix)
        assert await admitted(a, "g", 6, limit=10) == 6
        await anyio.sleep(FLUSH_INTERVAL_MS / 1000 * 2)
        # B's first event flushes: it learns A's 6 (flushed by A's first event
        # after the interval, below) only once A has flushed them.
        assert await admitted(a, "g", 1, limit=10) == 1  # flushes A's 6: Redis 6
        assert await admitted(b, "g", 10, limit=10) == 4  # knows 6, admits 4
        # Over many rounds both processes together stay within the limit plus
        # what each admits between two of its flushes (here 3 per round).
        c, d = RateLimiter(client, prefix + "x"), RateLimiter(client, prefix + "x")
        total = 0
        for _round in range(10):
            total += await admitted(c, "g", 3, limit=20)
            total += await admitted(d, "g", 3, limit=20)
            await anyio.sleep(FLUSH_INTERVAL_MS / 1000 * 1.5)
        assert 20 <= total <= 20 + 2 * 3
    finally:
        await client.aclose()


async def test_redis_failure_fails_open() -> None:
    # Nothing listens there: the limiter must not fail or stall requests.
    client: RedisClient = redis.asyncio.Redis(port=1, socket_connect_timeout=0.2)
    try:
        limiter = RateLimiter(client, "down")
        with anyio.fail_after(5):
            assert await admitted(limiter, "g", 3, limit=10) == 3
    finally:
        await client.aclose()
